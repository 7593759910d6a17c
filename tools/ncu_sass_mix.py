import csv,sys,re,collections
f=sys.argv[1]
rows=list(csv.reader(open(f)))
hdr=rows[1]; data=rows[2:]
ia=hdr.index("Instructions Executed"); isrc=hdr.index("Source"); iss=hdr.index("Warp Stall Sampling (All Samples)")
tot=0; ops=collections.Counter(); samp=collections.Counter(); seq=[]
for r in data:
    if len(r)<=ia: continue
    try: n=int(r[ia].replace(',',''))
    except: continue
    src=r[isrc].strip(); op=src.split()[0] if src else '?'
    if op.startswith('@'): op=src.split()[1]
    opb=op.split('.')[0]
    ops[opb]+=n; tot+=n; samp[opb]+=int(r[iss] or 0)
    seq.append((n,src,int(r[iss] or 0)))
print("total",tot)
for k,v in ops.most_common(30): print(f"{k:10s} {v:9d} {100*v/tot:5.1f}%  samples {samp[k]}")

// Encode throughput of tiktoken (npm, the WASM build of OpenAI's tiktoken) with o200k_base on the
// texts of bench/data, single thread, in decimal MB/s. The C++ counterpart is
// bench/cpu/tokenizer_bench.cpp; results go to bench/results/tokenizer_cpu.md.
//   cd bench/tokenizer && npm ci && node tiktoken_bench.mjs [--min-seconds S]
import fs from 'fs';
import path from 'path';
import { fileURLToPath } from 'url';
import { get_encoding } from 'tiktoken';

const here = path.dirname(fileURLToPath(import.meta.url));
const dataDir = path.join(here, '..', 'data');
const minSeconds = Number(process.argv[process.argv.indexOf('--min-seconds') + 1]) || 3;

const enc = get_encoding('o200k_base');

// MB/s over wall time and over this process's CPU time (user + system; the figure to compare on
// a busy machine, like Google Benchmark's CPU column).
function measure(text) {
  const bytes = Buffer.byteLength(text);
  enc.encode_ordinary(text);  // warm up
  let iterations = 0, tokens = 0;
  const start = process.hrtime.bigint();
  const cpuStart = process.cpuUsage();
  let elapsed = 0;
  do {
    tokens = enc.encode_ordinary(text).length;
    iterations++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  } while (elapsed < minSeconds);
  const cpu = process.cpuUsage(cpuStart);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  return { bytes, tokens, wall: (bytes * iterations) / elapsed / 1e6, cpu: (bytes * iterations) / cpuSeconds / 1e6 };
}

console.log(`tiktoken ${JSON.parse(fs.readFileSync(path.join(here, 'node_modules/tiktoken/package.json'))).version}, ` +
            `node ${process.version}, o200k_base encode_ordinary`);
for (const name of ['english', 'code', 'multilingual']) {
  const text = fs.readFileSync(path.join(dataDir, `tokenizer_${name}.txt`), 'utf8');
  const r = measure(text);
  console.log(`${name.padEnd(13)} ${String(r.bytes).padStart(8)} bytes ${String(r.tokens).padStart(7)} tokens ` +
              `${r.cpu.toFixed(2).padStart(8)} MB/s (CPU time) ${r.wall.toFixed(2).padStart(8)} MB/s (wall)`);
}
// One piece of n repeated characters: tiktoken's merge loop is quadratic in the piece length.
for (const [label, ch] of [['a', 'a'], ['space', ' ']]) {
  for (const n of [5000, 10000, 20000]) {
    const text = ch.repeat(n);
    const start = process.hrtime.bigint();
    const tokens = enc.encode_ordinary(text).length;
    const s = Number(process.hrtime.bigint() - start) / 1e9;
    console.log(`run of ${n} '${label}': ${tokens} tokens in ${s.toFixed(3)} s`);
  }
}
enc.free();

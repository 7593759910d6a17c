// Writes the tokenizer benchmark texts to bench/data/ (deterministic; run from anywhere):
//   node bench/tokenizer/gen_texts.mjs
// tokenizer_english.txt: English prose, tokenizer_code.txt: C++/Python/JavaScript-like source,
// tokenizer_multilingual.txt: sentences in a dozen scripts. About 256 KB each, made from small
// word lists by a seeded generator, so the files are original and reproducible.
import fs from 'fs';
import path from 'path';
import { fileURLToPath } from 'url';

const outDir = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'data');
const kTargetBytes = 256 * 1024;

function rng(seed) {  // mulberry32
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
function make(seed, paragraph) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const int = (n) => Math.floor(r() * n);
  let out = '';
  while (Buffer.byteLength(out) < kTargetBytes) out += paragraph(r, pick, int);
  // Trim whole code points (never half a surrogate pair) down to the target size.
  const cps = Array.from(out);
  while (Buffer.byteLength(out) > kTargetBytes) out = out.slice(0, out.length - cps.pop().length);
  return out;
}
const cap = (s) => s[0].toUpperCase() + s.slice(1);

// ---- English prose ------------------------------------------------------------------------------
const det = ['the', 'a', 'this', 'that', 'every', 'each', 'another', 'some', 'no', 'their', 'our', 'its'];
const adj = ['quiet', 'heavy', 'bright', 'narrow', 'ancient', 'practical', 'curious', 'remote', 'simple', 'careful',
  'uncertain', 'ordinary', 'sudden', 'gentle', 'stubborn', 'generous', 'hollow', 'crowded', 'distant', 'modest',
  'reliable', 'fragile', 'obvious', 'peculiar', 'steady', 'northern', 'broken', 'familiar', 'expensive', 'patient'];
const noun = ['river', 'village', 'engineer', 'letter', 'machine', 'harbor', 'question', 'garden', 'teacher', 'bridge',
  'window', 'market', 'morning', 'journey', 'council', 'library', 'storm', 'farmer', 'signal', 'mountain', 'story',
  'kitchen', 'doctor', 'experiment', 'railway', 'century', 'neighbor', 'lantern', 'agreement', 'theory', 'island',
  'factory', 'painter', 'winter', 'committee', 'road', 'student', 'river valley', 'report', 'decision', 'price'];
const verb = ['carried', 'noticed', 'built', 'questioned', 'followed', 'repaired', 'described', 'ignored', 'measured',
  'opened', 'defended', 'remembered', 'crossed', 'explained', 'borrowed', 'changed', 'watched', 'collected',
  'finished', 'avoided', 'discovered', 'returned', 'organized', 'tested', 'praised', 'reached', 'counted'];
const adv = ['slowly', 'quickly', 'rarely', 'almost', 'carefully', 'suddenly', 'quietly', 'eventually', 'barely',
  'honestly', 'certainly', 'often', 'never', 'already', 'still', 'perhaps', 'together', 'again', 'later'];
const prep = ['in', 'on', 'near', 'under', 'across', 'behind', 'beyond', 'toward', 'without', 'during', 'after',
  'before', 'along', 'through', 'beside', 'among', 'despite', 'within', 'around', 'against'];
const conj = ['and', 'but', 'because', 'although', 'while', 'so', 'yet', 'since', 'unless', 'until'];
const names = ['Maria', 'Jonas', 'Aiko', 'Samuel', 'Priya', 'Elena', 'Tomas', 'Grace', 'Omar', 'Lucia', 'Henrik',
  'the Harrisons', 'Dr. Okafor', 'Mrs. Whitfield', 'Professor Lindqvist', 'Captain Reyes'];
const places = ['Lisbon', 'the old quarter', 'Kyoto', 'the northern coast', 'Valparaiso', 'the county fair',
  'Edinburgh', 'the eastern ridge', 'Marrakesh', 'the lower town'];
const says = ["I don't think so", "we'll see", "it's later than you think", "they're not coming back",
  "you've done enough", "that's the whole point", "I'd rather walk", "she's been here before", "it isn't far"];
function np(pick, r) { return pick(det) + ' ' + (r() < 0.6 ? pick(adj) + ' ' : '') + pick(noun); }
function englishSentence(r, pick, int) {
  const k = int(9);
  if (k === 0) return `${pick(names)} ${pick(verb)} ${np(pick, r)} ${pick(prep)} ${pick(places)}.`;
  if (k === 1) return `"${cap(pick(says))}," ${pick(names)} said, "${pick(says)}."`;
  if (k === 2) return `In ${1800 + int(225)}, ${np(pick, r)} ${pick(verb)} ${int(90) + 2} ${pick(noun)}s for $${int(900) + 10}.${int(10)}${int(10)}.`;
  if (k === 3) return `${cap(np(pick, r))} was ${pick(adv)} ${pick(adj)}, ${pick(conj)} ${np(pick, r)} ${pick(verb)} it ${pick(adv)}.`;
  if (k === 4) return `${cap(pick(adv))}, ${np(pick, r)} ${pick(verb)} ${np(pick, r)} (${pick(adj)}, ${pick(adj)}) ${pick(prep)} ${np(pick, r)}.`;
  if (k === 5) return `Why had ${np(pick, r)} ${pick(verb)} ${np(pick, r)} ${pick(prep)} ${pick(places)}?`;
  if (k === 6) return `${cap(np(pick, r))}'s ${pick(noun)} ${pick(verb)} about ${int(100)}% of ${np(pick, r)}; ${np(pick, r)} ${pick(verb)} the rest.`;
  if (k === 7) return `${pick(names)} and ${pick(names)} ${pick(verb)} ${np(pick, r)} — ${pick(adv)} ${pick(adj)} — ${pick(prep)} ${np(pick, r)}.`;
  return `${cap(np(pick, r))} ${pick(verb)} ${np(pick, r)} ${pick(conj)} ${np(pick, r)} ${pick(adv)} ${pick(verb)} ${np(pick, r)}.`;
}
const english = make(1, (r, pick, int) => {
  let p = '';
  const n = 3 + int(6);
  for (let i = 0; i < n; i++) p += (i ? ' ' : '') + englishSentence(r, pick, int);
  return p + '\n\n';
});

// ---- Source code --------------------------------------------------------------------------------
const words = ['buffer', 'count', 'index', 'node', 'value', 'result', 'offset', 'config', 'request', 'token', 'cache',
  'stream', 'block', 'layer', 'weight', 'scale', 'batch', 'item', 'entry', 'state', 'queue', 'path', 'size', 'limit'];
const verbsCode = ['get', 'set', 'find', 'load', 'parse', 'update', 'compute', 'build', 'reset', 'push', 'read', 'write'];
const types = ['int', 'size_t', 'float', 'double', 'bool', 'std::string', 'uint32_t', 'std::vector<int>'];
const camel = (pick) => pick(verbsCode) + cap(pick(words));
const snake = (pick) => pick(verbsCode) + '_' + pick(words);
function cppFunction(r, pick, int) {
  const name = camel(pick), a = pick(words), b = pick(words) + 's';
  let s = `// ${cap(pick(verbsCode))}s the ${pick(words)} of each ${pick(words)} and returns the ${pick(words)}.\n`;
  s += `static ${pick(types)} ${name}(const ${pick(types)}& ${a}, ${pick(types)} ${b}) {\n`;
  s += `    if (${a}.empty() || ${b} < ${int(64)}) {\n        return ${int(10) - 1};\n    }\n`;
  s += `    for (size_t i = 0; i < ${a}.size(); ++i) {\n`;
  s += `        ${b} += ${a}[i] * ${int(1000) / 100} + 0x${int(65536).toString(16).padStart(4, '0')};\n`;
  s += `        if (${b} > kMax${cap(pick(words))}) break;  // ${pick(adj)} ${pick(noun)}\n    }\n`;
  s += `    std::printf("%s: %d\\n", "${name}", static_cast<int>(${b}));\n    return ${b};\n}\n\n`;
  return s;
}
function pyFunction(r, pick, int) {
  const name = snake(pick), a = pick(words), b = pick(words);
  let s = `def ${name}(${a}, ${b}=None, *, ${pick(words)}=${int(100)}):\n`;
  s += `    """${cap(pick(verbsCode))} the ${pick(words)} from ${a} (${pick(adj)} ${pick(noun)})."""\n`;
  s += `    if ${b} is None:\n        ${b} = {}\n`;
  s += `    for key, item in enumerate(${a}):\n        ${b}[key] = item ** ${int(4) + 1} // ${int(9) + 1}\n`;
  s += `    return [x for x in ${b}.values() if x != ${int(50)}]  # ${pick(adv)}\n\n\n`;
  return s;
}
function jsFunction(r, pick, int) {
  const name = camel(pick), a = pick(words);
  let s = `export async function ${name}(${a}) {\n`;
  s += `  const res = await fetch(\`/api/v${int(3) + 1}/${pick(words)}/\${${a}.id}\`, { method: 'POST' });\n`;
  s += `  if (!res.ok) throw new Error('${pick(verbsCode)} failed: ' + res.status);\n`;
  s += `  return (await res.json()).${pick(words)}s.map((x) => x.${pick(words)} ?? ${int(10)});\n}\n\n`;
  return s;
}
const code = make(2, (r, pick, int) => {
  const k = int(3);
  return k === 0 ? cppFunction(r, pick, int) : k === 1 ? pyFunction(r, pick, int) : jsFunction(r, pick, int);
});

// ---- Multilingual -------------------------------------------------------------------------------
const langs = [
  { sep: ' ', end: '.', words: ['der', 'die', 'Stadt', 'Fluss', 'heute', 'schnell', 'Straße', 'über', 'Brücke', 'Lehrerin', 'geöffnet', 'Nachrichten', 'wir', 'haben', 'größer'] },
  { sep: ' ', end: '.', words: ['le', 'la', 'maison', 'été', 'très', 'rivière', 'déjà', 'écrit', 'nous', 'avons', 'français', 'château', 'fenêtre', 'où', 'garçon'] },
  { sep: ' ', end: '.', words: ['el', 'la', 'ciudad', 'niño', 'mañana', 'está', 'canción', 'pequeño', 'árbol', 'también', 'corazón', 'después', 'nosotros', 'jamás'] },
  { sep: ' ', end: '.', words: ['город', 'река', 'сегодня', 'быстро', 'учитель', 'мост', 'открыт', 'новости', 'мы', 'были', 'большой', 'зимой', 'дом', 'письмо'] },
  { sep: ' ', end: '.', words: ['πόλη', 'ποτάμι', 'σήμερα', 'γρήγορα', 'δάσκαλος', 'γέφυρα', 'ανοιχτό', 'νέα', 'εμείς', 'μεγάλο', 'σπίτι', 'θάλασσα'] },
  { sep: '', end: '。', words: ['城市', '河流', '今天', '很快', '老师', '桥梁', '打开', '新闻', '我们', '已经', '大学', '天气', '朋友', '电脑', '学习', '问题'] },
  { sep: '', end: '。', words: ['東京', 'は', 'の', '川', '今日', '先生', '橋', 'ニュース', '私たち', 'が', 'を', 'コンピュータ', '勉強', 'しました', 'です'] },
  { sep: ' ', end: '.', words: ['도시', '강', '오늘', '빠르게', '선생님', '다리', '열린', '뉴스', '우리는', '했습니다', '학교', '친구', '컴퓨터'] },
  { sep: ' ', end: '.', words: ['المدينة', 'النهر', 'اليوم', 'بسرعة', 'المعلم', 'الجسر', 'مفتوح', 'الأخبار', 'نحن', 'كبير', 'البيت', 'كتاب'] },
  { sep: ' ', end: '।', words: ['शहर', 'नदी', 'आज', 'जल्दी', 'शिक्षक', 'पुल', 'खुला', 'समाचार', 'हम', 'बड़ा', 'घर', 'किताब', 'दोस्त'] },
  { sep: ' ', end: '.', words: ['thành phố', 'sông', 'hôm nay', 'nhanh', 'giáo viên', 'cây cầu', 'mở', 'tin tức', 'chúng tôi', 'lớn', 'nhà'] },
  { sep: '', end: ' ', words: ['เมือง', 'แม่น้ำ', 'วันนี้', 'เร็ว', 'ครู', 'สะพาน', 'เปิด', 'ข่าว', 'พวกเรา', 'ใหญ่', 'บ้าน'] },
  { sep: ' ', end: '!', words: ['😀', '🎉', '👍🏽', '🇯🇵', '❤️', 'ok', '100%', '🚀', '✨', '2024', '☕'] },
];
const multilingual = make(3, (r, pick, int) => {
  const lang = pick(langs);
  const n = 4 + int(10);
  let s = '';
  for (let i = 0; i < n; i++) s += (i ? lang.sep : '') + pick(lang.words);
  if (lang.sep === ' ') s = cap(s);
  return s + lang.end + (r() < 0.15 ? '\n' : ' ');
});

fs.mkdirSync(outDir, { recursive: true });
for (const [name, text] of [['english', english], ['code', code], ['multilingual', multilingual]]) {
  const file = path.join(outDir, `tokenizer_${name}.txt`);
  fs.writeFileSync(file, text);
  console.log(`${file}: ${Buffer.byteLength(text)} bytes`);
}

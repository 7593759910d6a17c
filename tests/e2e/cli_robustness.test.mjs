// End-to-end: the `gptoss` process itself under signals, bad environment and unwritable output (session 59's
// black-box findings): SIGHUP stops the server as SIGTERM does (an open stream gets its error event and [DONE], exit
// 0; it was killed mid-stream), a command whose output cannot be written fails (it exited 0 with nothing written), a
// GPTOSS_TOKENIZER naming a missing file is an error (the fixture was used silently), an empty --host is refused.
//
// Run: GPTOSS_BIN=build/gptoss node --test tests/e2e/cli_robustness.test.mjs   (ctest: e2e_cli_robustness)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePort, sleep } from './util.mjs';

const BIN = process.env.GPTOSS_BIN || path.resolve('build/gptoss');
const WORK = process.env.GPTOSS_E2E_WORK || fs.mkdtempSync(path.join(os.tmpdir(), 'gptoss-e2e-'));
let model;

before(() => {
  model = path.join(WORK, 'tiny-model');
  if (!fs.existsSync(path.join(model, 'config.json'))) {
    fs.mkdirSync(WORK, { recursive: true });
    execFileSync(BIN, ['init-model', '--preset', 'tiny', '--out', model, '--seed', '0'], { stdio: 'inherit' });
  }
});

test('SIGHUP shuts the server down cleanly: the open stream ends with an error event and [DONE]', async () => {
  const port = await freePort();
  let log = '';
  const proc = spawn(BIN, ['serve', '--model', model, '--host', '127.0.0.1', '--port', String(port),
                           '--kv-cache-mb', '32'], { stdio: ['ignore', 'pipe', 'pipe'] });
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 120000;
  while (Date.now() < deadline) {
    assert.equal(proc.exitCode, null, log);
    try {
      if ((await fetch(`${base}/health`)).status === 200) break;
    } catch {}
    await sleep(100);
  }
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4000, min_tokens: 4000,
                           stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let body = '';
  const first = await reader.read();  // the stream is open
  body += new TextDecoder().decode(first.value);
  proc.kill('SIGHUP');
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    body += new TextDecoder().decode(value);
  }
  const { code, signal } = await Promise.race([exited, sleep(20000).then(() => ({ code: null, signal: 'timeout' }))]);
  if (signal === 'timeout') proc.kill('SIGKILL');
  assert.equal(signal, null, `killed by ${signal}:\n${log}`);
  assert.equal(code, 0, log);
  assert.match(body, /shutting down/);
  assert.match(body, /data: \[DONE\]\n\n$/);
  assert.match(log, /shutting down \(SIGHUP\)/);
});

test('output that cannot be written is an error', { skip: !fs.existsSync('/dev/full') }, () => {
  const fd = fs.openSync('/dev/full', 'w');
  const r = spawnSync(BIN, ['tokenize'], { input: 'hello', stdio: ['pipe', fd, 'pipe'] });
  fs.closeSync(fd);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr.toString(), /writing the output failed/);
});

test('GPTOSS_TOKENIZER naming a missing file, an empty --host, a bad GPTOSS_NUM_THREADS', () => {
  const tok = spawnSync(BIN, ['tokenize'], { input: 'hello',
                                             env: { ...process.env, GPTOSS_TOKENIZER: path.join(WORK, 'nope.json') } });
  assert.notEqual(tok.status, 0);
  assert.match(tok.stderr.toString(), /nope\.json/);
  const host = spawnSync(BIN, ['serve', '--model', model, '--host', '', '--port', '0']);
  assert.notEqual(host.status, 0);
  assert.match(host.stderr.toString(), /--host/);
  const threads = spawnSync(BIN, ['generate', '--model', model, '--ids', '1,2', '--max-tokens', '1'],
                            { env: { ...process.env, GPTOSS_NUM_THREADS: '100000' } });
  assert.equal(threads.status, 0, threads.stderr.toString());
  assert.match(threads.stderr.toString(), /GPTOSS_NUM_THREADS='100000' is not a thread count/);
});

test("an empty path flag is refused, not read as absent (`--tokenizer ''` used the fixture)", () => {
  for (const args of [['tokenize', '--tokenizer', ''], ['detokenize', '--tokenizer', ''],
                      ['harmony', 'render', '--tokenizer', ''],
                      ['generate', '--model', model, '--tokenizer', '', '--ids', '1', '--max-tokens', '1'],
                      ['generate', '--model', '', '--ids', '1', '--max-tokens', '1'],
                      ['init-model', '--preset', 'tiny', '--out', '']]) {
    const r = spawnSync(BIN, args, { input: 'hello' });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr.toString(), /empty path/, args.join(' '));
  }
});

test('tokenize --special knows every reserved id tiktoken o200k_harmony lists, not only the file\'s', () => {
  const run = (args, input) => {
    const r = spawnSync(BIN, args, { input });
    assert.equal(r.status, 0, r.stderr.toString());
    return r.stdout.toString().trim();
  };
  const text = 'a<|reserved_200500|>b<|reserved_200018|><|reserved_201087|><|reserved_201088|><|reserved_200002|>';
  const ids = JSON.parse(run(['tokenize', '--special'], text));
  // 200018's reserved name is tiktoken's second name for <|endofprompt|>; 201088 is past the vocabulary and
  // 200002 is <|return|> (no reserved name): both stay text.
  assert.deepEqual(ids.slice(0, 5), [64, 200500, 65, 200018, 201087]);
  assert.ok(ids.slice(5).every((id) => id < 199998), JSON.stringify(ids));
  assert.equal(run(['detokenize'], JSON.stringify(ids)), text.replace('<|reserved_200018|>', '<|endofprompt|>'));
  // Without --special the same text is ordinary tokens.
  assert.ok(JSON.parse(run(['tokenize'], text)).every((id) => id < 199998));
});

test('serve refuses a --cors-origin with control bytes and an empty --served-model-name; tokenize --jsonl refuses an empty line', () => {
  const cors = spawnSync(BIN, ['serve', '--model', model, '--port', '0', '--cors-origin', 'a\r\nX-Evil: 1']);
  assert.notEqual(cors.status, 0);
  assert.match(cors.stderr.toString(), /--cors-origin/);
  const name = spawnSync(BIN, ['serve', '--model', model, '--port', '0', '--served-model-name', '']);
  assert.notEqual(name.status, 0);
  assert.match(name.stderr.toString(), /served-model-name/);
  // A skipped empty line shifted every later output line against its input line.
  const jl = spawnSync(BIN, ['tokenize', '--jsonl'], { input: '"a"\n\n"b"\n' });
  assert.notEqual(jl.status, 0);
  assert.match(jl.stderr.toString(), /line 2: empty/);
  const ok = spawnSync(BIN, ['tokenize', '--jsonl'], { input: '"a"\n"b"\n' });
  assert.equal(ok.status, 0, ok.stderr.toString());
  assert.equal(ok.stdout.toString().trim().split('\n').length, 2);
});

test('logits --out writes through a symlink and a FIFO instead of replacing them; bad report paths fail before the run', async () => {
  const dir = fs.mkdtempSync(path.join(WORK, 'out-'));
  // A symlink: the file it names gets the logits, the link stays a link (it was replaced by a regular file).
  const real = path.join(dir, 'real.safetensors');
  fs.writeFileSync(real, 'old');
  const link = path.join(dir, 'link.safetensors');
  fs.symlinkSync(real, link);
  const viaLink = spawnSync(BIN, ['logits', '--model', model, '--ids', '1,2,3', '--out', link]);
  assert.equal(viaLink.status, 0, viaLink.stderr.toString());
  assert.ok(fs.lstatSync(link).isSymbolicLink());
  const bytes = fs.readFileSync(real);
  const headerLen = Number(bytes.readBigUInt64LE(0));
  assert.ok(JSON.parse(bytes.subarray(8, 8 + headerLen).toString()).logits);
  // A FIFO (as /dev/null or /dev/stdout would be: not a regular file): written through, still a FIFO after.
  const fifo = path.join(dir, 'pipe');
  execFileSync('mkfifo', [fifo]);
  const child = spawn(BIN, ['logits', '--model', model, '--ids', '1,2,3', '--out', fifo]);
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
  const received = await new Promise((resolve, reject) => {
    const chunks = [];
    fs.createReadStream(fifo).on('data', (c) => chunks.push(c)).on('end', () => resolve(Buffer.concat(chunks)))
      .on('error', reject);
  });
  assert.equal(await exited, 0, err);
  assert.ok(fs.statSync(fifo).isFIFO());
  assert.equal(received.length, bytes.length);
  // Paths that cannot be written fail at once, before the model loads or a benchmark runs.
  for (const args of [['logits', '--model', model, '--ids', '1', '--out', path.join(dir, 'no', 'such.st')],
                      ['logits', '--model', model, '--ids', '1', '--out', dir],
                      ['bench-serve', '--synthetic', 'tiny', '--backend', 'cpu', '--markdown',
                       path.join(dir, 'no', 'such.md')]]) {
    const r = spawnSync(BIN, args, { timeout: 20000 });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr.toString(), /cannot write .*(no directory|is a directory)/, args.join(' '));
  }
  // Never into the checkpoint being read: --out model/model.safetensors replaced the weights with the logits.
  const weights = fs.readdirSync(model).find((f) => f.endsWith('.safetensors'));
  const before = fs.statSync(path.join(model, weights));
  for (const out of [path.join(model, weights), path.join(model, '..', path.basename(model), 'new.safetensors')]) {
    const r = spawnSync(BIN, ['logits', '--model', model, '--ids', '1', '--out', out], { timeout: 20000 });
    assert.notEqual(r.status, 0, out);
    assert.match(r.stderr.toString(), /inside the model directory/, out);
  }
  const after = fs.statSync(path.join(model, weights));
  assert.equal(after.size, before.size);
  assert.equal(after.mtimeMs, before.mtimeMs);
  assert.ok(!fs.existsSync(path.join(model, 'new.safetensors')));
});

test('generate --batch-file bounds a line (a file with no newline grew without bound); render checks current_date', () => {
  const big = path.join(WORK, 'one-long-line.jsonl');
  fs.writeFileSync(big, Buffer.alloc((16 << 20) + 10, 0x20));
  const r = spawnSync(BIN, ['generate', '--model', model, '--batch-file', big, '--max-tokens', '1']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr.toString(), /line 1 is longer than 16 MiB/);
  const render = (date) => spawnSync(BIN, ['harmony', 'render'], {
    input: JSON.stringify({ api: 'chat.completions', server_options: { current_date: date },
                            request: { messages: [{ role: 'user', content: 'hi' }] } }) });
  const bad = render('2026-02-30');
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr.toString(), /current_date/);
  const good = render('2024-02-29');
  assert.equal(good.status, 0, good.stderr.toString());
  assert.match(JSON.parse(good.stdout.toString()).text, /Current date: 2024-02-29/);
});

test('errors quoting file bytes are escaped; an unreadable tokenizer.json is said, not skipped', () => {
  const dir = fs.mkdtempSync(path.join(WORK, 'bytes-'));
  for (const f of fs.readdirSync(model)) fs.copyFileSync(path.join(model, f), path.join(dir, f));
  fs.writeFileSync(path.join(dir, 'config.json'), Buffer.concat([Buffer.from('{"model_type": "gpt_oss", "x": "'),
                                                                 Buffer.from([0xff, 0x1b]), Buffer.from('"')]));
  const r = spawnSync(BIN, ['logits', '--model', dir, '--ids', '1']);
  assert.notEqual(r.status, 0);
  assert.ok(!r.stderr.includes(0xff) && !r.stderr.includes(0x1b), JSON.stringify(r.stderr.toString('latin1')));
  assert.match(r.stderr.toString(), /\\xff/);
  // A broken tokenizer.json: generate --ids still runs (it needs no text), but says why its output has no "text".
  for (const f of fs.readdirSync(model)) fs.copyFileSync(path.join(model, f), path.join(dir, f));
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), '{"model":');
  const g = spawnSync(BIN, ['generate', '--model', dir, '--ids', '1,2', '--max-tokens', '2']);
  assert.equal(g.status, 0, g.stderr.toString());
  assert.match(g.stderr.toString(), /no "text".*tokenizer\.json/);
  assert.ok(!('text' in JSON.parse(g.stdout.toString())));
  // --model naming a file, or nothing: said so (it was "DIR/config.json: cannot open config").
  const file = spawnSync(BIN, ['logits', '--model', path.join(dir, 'config.json'), '--ids', '1']);
  assert.match(file.stderr.toString(), /is a file, not a model directory/);
  const none = spawnSync(BIN, ['logits', '--model', path.join(dir, 'nope'), '--ids', '1']);
  assert.match(none.stderr.toString(), /model directory .*nope does not exist/);
  // A link loop for the directory or its config.json, and a FIFO config.json (its open hung): each said as it is.
  fs.symlinkSync(path.join(dir, 'loop'), path.join(dir, 'loop'));
  const loop = spawnSync(BIN, ['logits', '--model', path.join(dir, 'loop'), '--ids', '1']);
  assert.match(loop.stderr.toString(), /loop: Too many levels of symbolic links/);
  fs.rmSync(path.join(dir, 'config.json'));
  spawnSync('mkfifo', [path.join(dir, 'config.json')]);
  const fifo = spawnSync(BIN, ['logits', '--model', dir, '--ids', '1'], { timeout: 20000 });
  assert.equal(fifo.signal, null, 'the load hung on the FIFO');
  assert.match(fifo.stderr.toString(), /config\.json: not a regular file/);
});

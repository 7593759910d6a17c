// End-to-end: prefill/decode disaggregation (server/disaggregation.h) with the official `openai` npm client.
// A prefill worker and a decode worker (`gptoss serve --disaggregation-mode prefill|decode`) on the CPU backend
// with the tiny random model: the decode worker's greedy answers, whole and streamed, equal the prefill worker
// answering alone, its metrics count the imported KV, and it keeps answering after the prefill worker is gone. Both
// workers require an API key (the prefill worker's by --api-key, the decode worker's by GPTOSS_API_KEY): the decode
// worker asks the prefill worker with its own, a client without the key gets 401, /health and /metrics stay open.
//
// Run: GPTOSS_BIN=build/gptoss node --test tests/e2e/disaggregation.test.mjs   (ctest: e2e_disaggregation)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { freePort, sleep } from './util.mjs';

const BIN = process.env.GPTOSS_BIN || path.resolve('build/gptoss');
const WORK = process.env.GPTOSS_E2E_WORK || fs.mkdtempSync(path.join(os.tmpdir(), 'gptoss-e2e-'));
const MODEL = 'tiny';

// A `gptoss serve` child on a free port with `extra` flags; resolves once /health says 200.
const KEY = 'sk-e2e-disaggregation';

async function startServer(model, extra, env = {}) {
  const port = await freePort();
  const s = { port, base: `http://127.0.0.1:${port}`, log: '' };
  s.proc = spawn(BIN, ['serve', '--model', model, '--host', '127.0.0.1', '--port', String(port),
                       '--served-model-name', MODEL, '--kv-cache-mb', '32', ...extra],
                 { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  s.proc.stdout.on('data', (d) => { s.log += d; });
  s.proc.stderr.on('data', (d) => { s.log += d; });
  const deadline = Date.now() + 120000;
  while (Date.now() < deadline) {
    if (s.proc.exitCode !== null) throw new Error(`gptoss serve exited (${s.proc.exitCode}):\n${s.log}`);
    try {
      if ((await fetch(`${s.base}/health`)).status === 200) break;
    } catch {}
    await sleep(100);
  }
  s.client = new OpenAI({ apiKey: KEY, baseURL: `${s.base}/v1`, maxRetries: 0, timeout: 120000 });
  return s;
}

async function stopServer(s) {
  if (!s || s.proc.exitCode !== null) return;
  const exited = new Promise((resolve) => s.proc.once('exit', (code) => resolve(code)));
  s.proc.kill('SIGTERM');
  const code = await Promise.race([exited, sleep(15000).then(() => null)]);
  if (code === null) s.proc.kill('SIGKILL');
  assert.equal(code, 0, `gptoss serve exit code on SIGTERM:\n${s.log}`);
}

async function metric(s, name) {
  const text = await (await fetch(`${s.base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  return m ? Number(m[1]) : undefined;
}

let prefill;
let decode;

before(async () => {
  const model = path.join(WORK, 'tiny-model');
  if (!fs.existsSync(path.join(model, 'config.json'))) {
    fs.mkdirSync(WORK, { recursive: true });
    execFileSync(BIN, ['init-model', '--preset', 'tiny', '--out', model, '--seed', '0'], { stdio: 'inherit' });
  }
  prefill = await startServer(model, ['--disaggregation-mode', 'prefill', '--api-key', KEY]);
  decode = await startServer(model, ['--disaggregation-mode', 'decode', '--prefill-url', prefill.base],
                             { GPTOSS_API_KEY: KEY });
});

after(async () => {
  await stopServer(decode);
  await stopServer(prefill);
});

const messages = [
  { role: 'system', content: 'You answer questions about lighthouses, ships and the weather at sea, at length.' },
  { role: 'user', content: 'Tell me a story about a cat that lived in a lighthouse and watched the ships go by.' },
];

test('the decode worker answers as the prefill worker alone, whole and streamed', async () => {
  const params = { model: MODEL, messages, max_tokens: 12, temperature: 0, logprobs: true };
  const alone = await prefill.client.chat.completions.create(params);
  const got = await decode.client.chat.completions.create(params);
  assert.deepEqual(got.choices[0].message, alone.choices[0].message);
  assert.deepEqual(got.choices[0].logprobs.content.map((t) => t.logprob),
                   alone.choices[0].logprobs.content.map((t) => t.logprob));
  const cached = got.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0 && cached < got.usage.prompt_tokens, JSON.stringify(got.usage));
  const streamed = await decode.client.chat.completions.stream({ ...params, stream_options: { include_usage: true } })
    .finalChatCompletion();
  assert.equal(streamed.choices[0].message.reasoning_content ?? null, alone.choices[0].message.reasoning_content ?? null);
  // The first request's prompt was fetched; the streamed repeat found it in the decode worker's own cache.
  assert.equal(await metric(decode, 'gptoss_remote_prefills_total'), 1);
  assert.equal(await metric(decode, 'gptoss_remote_prefills_skipped_total'), 1);
  assert.ok(await metric(decode, 'gptoss_kv_imported_tokens_total') >= cached);
  assert.ok(await metric(prefill, 'gptoss_kv_exported_tokens_total') >= cached);
  assert.ok(await metric(decode, 'gptoss_remote_prefill_bytes_total') > 0);
  assert.equal(await metric(decode, 'gptoss_remote_prefill_failures_total'), 0);
});

test('without the API key a client gets 401 and nothing runs', async () => {
  for (const s of [prefill, decode]) {
    const stranger = new OpenAI({ apiKey: 'sk-wrong', baseURL: `${s.base}/v1`, maxRetries: 0 });
    await assert.rejects(stranger.chat.completions.create({ model: MODEL, messages, max_tokens: 2 }),
                         (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 &&
                                e.code === 'invalid_api_key');
    const kv = await fetch(`${s.base}/v1/kv/prefill`, { method: 'POST', body: '{}' });
    assert.equal(kv.status, 401);
  }
});

test('a decode worker whose prefill worker is gone still answers', async () => {
  // A conversation the decode worker has not seen (its cache would otherwise serve it without a fetch).
  const fresh = [{ role: 'system', content: 'You write short poems about mountains, rivers and the snow in winter.' },
                 { role: 'user', content: 'Write a poem about a river that runs from a glacier down to the sea.' }];
  const params = { model: MODEL, messages: fresh, max_tokens: 8, temperature: 0 };
  const alone = await prefill.client.chat.completions.create(params);
  await stopServer(prefill);
  const got = await decode.client.chat.completions.create(params);
  assert.deepEqual(got.choices[0].message, alone.choices[0].message);
  assert.equal(await metric(decode, 'gptoss_remote_prefill_failures_total'), 1);
  const r = await decode.client.responses.create({ model: MODEL, input: 'Hello there, tell me about the sea.',
                                                    max_output_tokens: 6 });
  assert.equal(r.object, 'response');
});

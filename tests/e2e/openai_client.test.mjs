// End-to-end: the official `openai` npm client against `gptoss serve` on the CPU backend with a tiny
// random model (real vocabulary). Random weights give random text, so the checks are about shapes,
// protocol and consistency (usage == streamed tokens, every stream ends properly, no KV block
// leaks), not content; content-level checks live in tests/unit/server with a scripted engine.
//
// Run: GPTOSS_BIN=build/gptoss node --test tests/e2e/   (ctest runs it as e2e_openai_client)
import { after, before, describe, test } from 'node:test';
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
const MAX_BODY = 1 << 20;
const KV_CACHE_MB = 32;

let server;
let serverLog = '';
let base;
let client;
let maxModelLen;


async function waitHealthy(timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`gptoss serve exited (${server.exitCode}):\n${serverLog}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) return;
      last = `${r.status} ${await r.text()}`;
      assert.equal(r.status, 503, 'health is 503 until ready');
    } catch (e) {
      last = String(e);
    }
    await sleep(100);
  }
  throw new Error(`server not healthy after ${timeoutMs} ms (${last}):\n${serverLog}`);
}

async function metrics() {
  const r = await fetch(`${base}/metrics`);
  assert.equal(r.status, 200);
  const text = await r.text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : undefined;
  };
  return { text, value };
}

// Waits until the engine holds no sequence and no KV block.
async function assertEngineIdle(timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let m;
  while (Date.now() < deadline) {
    m = await metrics();
    if (m.value('gptoss_running_sequences') === 0 && m.value('gptoss_kv_blocks_in_use') === 0 &&
        m.value('gptoss_queue_depth') === 0 && m.value('gptoss_requests_in_flight') === 0) {
      return m;
    }
    await sleep(100);
  }
  assert.fail(`engine not idle:\n${m.text}`);
}

// Expects `promise` to reject with an OpenAI APIError of `status` (and `param`, when given).
async function expectApiError(promise, status, param) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
    assert.equal(e.status, status, e.message);
    assert.equal(typeof e.error?.message, 'string');
    assert.equal(typeof e.error?.type, 'string');
    if (param !== undefined) assert.equal(e.param, param, e.message);
    return true;
  });
}

// Raw request; returns status and the parsed OpenAI error object (checking its shape).
async function rawError(method, url, body, headers = { 'content-type': 'application/json' }) {
  const r = await fetch(`${base}${url}`, { method, body, headers });
  const text = await r.text();
  const j = JSON.parse(text);
  assert.equal(typeof j.error?.message, 'string', text);
  assert.equal(typeof j.error?.type, 'string', text);
  assert.ok('param' in j.error && 'code' in j.error, text);
  return { status: r.status, error: j.error, headers: r.headers };
}

function checkChatUsage(usage, maxTokens, finishReason) {
  assert.ok(usage, 'usage present');
  assert.ok(usage.prompt_tokens > 0);
  assert.ok(usage.completion_tokens > 0 && usage.completion_tokens <= maxTokens, JSON.stringify(usage));
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  const reasoning = usage.completion_tokens_details?.reasoning_tokens;
  assert.ok(reasoning >= 0 && reasoning <= usage.completion_tokens);
  if (finishReason === 'length') assert.equal(usage.completion_tokens, maxTokens);
}

before(async () => {
  const model = path.join(WORK, 'tiny-model');
  if (!fs.existsSync(path.join(model, 'config.json'))) {
    fs.mkdirSync(WORK, { recursive: true });
    execFileSync(BIN, ['init-model', '--preset', 'tiny', '--out', model, '--seed', '0'], { stdio: 'inherit' });
  }
  assert.ok(fs.existsSync(path.join(model, 'tokenizer.json')), 'init-model copied the tokenizer (run scripts/setup.sh)');
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  server = spawn(BIN, ['serve', '--model', model, '--host', '127.0.0.1', '--port', String(port),
                       '--served-model-name', MODEL, '--max-body-bytes', String(MAX_BODY),
                       '--kv-cache-mb', String(KV_CACHE_MB),
                       // n-gram speculation on (drafts from any 1-token match). The tiny model's random
                       // text seldom repeats, so this checks the flags and the lookup on every step; the
                       // drafts' verification is runtime_tests' Speculative* and CudaEngine's.
                       '--speculative-tokens', '3', '--ngram-min', '1', '--speculative-max-running', '0'],
                 { stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout.on('data', (d) => { serverLog += d; });
  server.stderr.on('data', (d) => { serverLog += d; });
  await waitHealthy(120000);
  client = new OpenAI({ apiKey: 'unused', baseURL: `${base}/v1`, maxRetries: 0, timeout: 120000 });
  const models = await client.models.list();
  maxModelLen = models.data[0].max_model_len;
});

after(async () => {
  if (!server || server.exitCode !== null) return;
  const exited = new Promise((resolve) => server.once('exit', (code, signal) => resolve({ code, signal })));
  server.kill('SIGTERM');
  const result = await Promise.race([exited, sleep(15000).then(() => null)]);
  if (!result) {
    server.kill('SIGKILL');
    assert.fail(`gptoss serve did not stop on SIGTERM:\n${serverLog}`);
  }
  assert.equal(result.code, 0, `gptoss serve exit code on SIGTERM:\n${serverLog}`);
});

describe('models and health', () => {
  test('health, models list and retrieve', async () => {
    const h = await fetch(`${base}/health`);
    assert.equal(h.status, 200);
    const models = await client.models.list();
    assert.equal(models.data.length, 1);
    assert.equal(models.data[0].id, MODEL);
    assert.equal(models.data[0].object, 'model');
    assert.ok(maxModelLen > 1000);
    const one = await client.models.retrieve(MODEL);
    assert.equal(one.id, MODEL);
    await expectApiError(client.models.retrieve('nope'), 404);
  });
});

describe('chat.completions', () => {
  test('plain', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello!' }],
      max_tokens: 12, temperature: 0.8, seed: 1,
    });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.model, MODEL);
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
    assert.ok(c.message.content === null || typeof c.message.content === 'string');
    checkChatUsage(r.usage, 12, c.finish_reason);
  });

  test('n choices, whole and streamed through the SDK helper; a completions batch', async () => {
    const params = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6, seed: 3, n: 3 };
    const r = await client.chat.completions.create(params);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const s = await client.chat.completions.stream(params).finalChatCompletion();
    assert.equal(s.choices.length, 3);
    for (let i = 0; i < 3; ++i) {
      // (the stream's role chunk carries content "", as OpenAI's does: a choice without content is "" there)
      assert.equal(s.choices[i].message.content || null, r.choices[i].message.content || null);
      assert.equal(s.choices[i].message.reasoning_content ?? null, r.choices[i].message.reasoning_content ?? null);
    }
    const b = await client.completions.create({ model: MODEL, prompt: ['one', 'two'], max_tokens: 4, seed: 3 });
    assert.deepEqual(b.choices.map((c) => c.index), [0, 1]);
    const alone = await client.completions.create({ model: MODEL, prompt: 'two', max_tokens: 4, seed: 3 });
    assert.equal(b.choices[1].text, alone.choices[0].text);
  });

  test('streaming: chunks, one finish, usage, [DONE]; equals the non-streamed result', async () => {
    const params = { model: MODEL, messages: [{ role: 'user', content: 'Count to three.' }], max_completion_tokens: 16,
                     temperature: 0 };
    const whole = await client.chat.completions.create(params);
    const stream = await client.chat.completions.create({ ...params, stream: true,
                                                          stream_options: { include_usage: true } });
    let content = '';
    let reasoning = '';
    let finish;
    let usage;
    let n = 0;
    const ids = new Set();
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      ids.add(chunk.id);
      if (n++ === 0) assert.equal(chunk.choices[0].delta.role, 'assistant');
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices.length === 0) continue;
      const d = chunk.choices[0].delta;
      if (d.content) content += d.content;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      if (chunk.choices[0].finish_reason) {
        assert.equal(finish, undefined, 'one finish_reason');
        finish = chunk.choices[0].finish_reason;
      }
    }
    assert.equal(ids.size, 1);
    assert.ok(finish);
    checkChatUsage(usage, 16, finish);
    // Greedy and alone on the engine: the stream and the whole response are the same generation.
    assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
    assert.equal(finish, whole.choices[0].finish_reason);
    assert.equal(content, whole.choices[0].message.content ?? '');
    assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');

    // The raw SSE framing ends with data: [DONE].
    const raw = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...params, stream: true }),
    });
    assert.match(raw.headers.get('content-type'), /text\/event-stream/);
    const text = await raw.text();
    assert.ok(text.endsWith('data: [DONE]\n\n'), text.slice(-200));
    for (const block of text.split('\n\n').filter((b) => b && !b.startsWith(':'))) {
      assert.match(block, /^data: /);
    }
  });

  test('tools, tool_choice, and tool results in history', async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const messages = [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c":21}' },
    ];
    for (const tool_choice of ['auto', 'none', 'required', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice, max_tokens: 10 });
      const c = r.choices[0];
      checkChatUsage(r.usage, 10, c.finish_reason);
      for (const call of c.message.tool_calls ?? []) {
        assert.equal(call.type, 'function');
        assert.equal(typeof call.id, 'string');
        assert.equal(typeof call.function.name, 'string');
        assert.equal(typeof call.function.arguments, 'string');
      }
      if (c.message.tool_calls?.length) assert.equal(c.finish_reason, 'tool_calls');
    }
    await expectApiError(client.chat.completions.create({ model: MODEL, messages, tools,
      tool_choice: { type: 'function', function: { name: 'nope' } } }), 400, 'tool_choice.function.name');
  });

  test('structured outputs: response_format, guided_json on completions, refusals', async () => {
    const schema = { type: 'object', properties: { city: { type: 'string' }, n: { type: 'integer' } },
      required: ['city', 'n'], additionalProperties: false };
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'JSON?' }],
      max_tokens: 24, response_format: { type: 'json_schema', json_schema: { name: 'place', schema, strict: true } } });
    const c = r.choices[0];
    checkChatUsage(r.usage, 24, c.finish_reason);
    // Random weights rarely reach the final channel; when they do and it ends, the content is the schema's.
    if (c.finish_reason === 'stop' && c.message.content) {
      const doc = JSON.parse(c.message.content);
      assert.equal(typeof doc.city, 'string');
      assert.ok(Number.isInteger(doc.n));
    }
    // On completions the whole output is held to it from the first token.
    const k = await client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 16, temperature: 1,
      guided_json_object: true });
    const text = k.choices[0].text;
    assert.match(text, /^\s*\{/);
    if (k.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
    // A string pattern (and a format) hold the value; a keyword the output cannot be held to is refused.
    const p = await client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 24, temperature: 1,
      guided_json: { type: 'object', properties: { id: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
        day: { type: 'string', format: 'date' } }, required: ['id', 'day'] } });
    if (p.choices[0].finish_reason === 'stop') {
      const doc = JSON.parse(p.choices[0].text);
      assert.match(doc.id, /^[A-Z]{2}-\d{3}$/);
      assert.match(doc.day, /^\d{4}-\d{2}-\d{2}$/);
    }
    await expectApiError(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }],
      max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'p',
        schema: { type: 'array', uniqueItems: true } } } }), 400, 'response_format.json_schema.schema');
  });

  test('logprobs and reasoning_effort', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 8, logprobs: true, top_logprobs: 2, reasoning_effort: 'low' });
    const lp = r.choices[0].logprobs;
    assert.ok(Array.isArray(lp.content));
    assert.ok(lp.content.length <= r.usage.completion_tokens);
    for (const e of lp.content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.equal(e.top_logprobs.length, 2);
    }
  });
});

describe('responses', () => {
  // `sdk`: the object went through the SDK, which adds output_text.
  const checkOutput = (r, maxTokens, sdk = true) => {
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.ok(['completed', 'incomplete'].includes(r.status));
    if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    for (const item of r.output) assert.ok(['reasoning', 'message', 'function_call'].includes(item.type), item.type);
    assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= maxTokens);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    if (sdk) assert.equal(typeof r.output_text, 'string');
    if (r.status === 'incomplete') assert.equal(r.usage.output_tokens, maxTokens);
  };

  test('plain, with instructions and reasoning effort', async () => {
    const r = await client.responses.create({ model: MODEL, input: 'Tell me a joke.', instructions: 'Be funny.',
      reasoning: { effort: 'low' }, max_output_tokens: 12 });
    checkOutput(r, 12);
    assert.equal(r.instructions, 'Be funny.');
  });

  test('input items with a function call and its output', async () => {
    const r = await client.responses.create({
      model: MODEL, max_output_tokens: 10,
      tools: [{ type: 'function', name: 'lookup', description: 'Look up', parameters: { type: 'object',
        properties: { q: { type: 'string' } } }, strict: false }],
      input: [
        { role: 'user', content: 'Find x' },
        { type: 'function_call', call_id: 'c1', name: 'lookup', arguments: '{"q":"x"}' },
        { type: 'function_call_output', call_id: 'c1', output: 'found it' },
      ],
    });
    checkOutput(r, 10);
  });

  test('streaming events (raw iteration and the SDK stream helper)', async () => {
    const stream = await client.responses.create({ model: MODEL, input: 'Hi', max_output_tokens: 12, stream: true });
    const types = [];
    let seq = -1;
    const items = new Map();
    let final;
    for await (const e of stream) {
      types.push(e.type);
      assert.equal(e.sequence_number, seq + 1);
      seq = e.sequence_number;
      if (e.type === 'response.output_item.added') items.set(e.output_index, e.item.id);
      if (e.type.endsWith('.delta') || e.type.endsWith('.done') && e.type !== 'response.output_item.done') {
        assert.equal(items.get(e.output_index), e.item_id, `${e.type} for a known item`);
      }
      if (e.type === 'response.completed' || e.type === 'response.incomplete') final = e.response;
    }
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
    checkOutput(final, 12, false);
    assert.equal(final.output.length, items.size);

    // The SDK's accumulating stream validates the event sequence against the final response.
    const helper = client.responses.stream({ model: MODEL, input: 'Hello', max_output_tokens: 8 });
    const done = await helper.finalResponse();
    checkOutput(done, 8);
  });

  test('logprobs on output_text (top_logprobs) from the real engine', async () => {
    const r = await client.responses.create({ model: MODEL, input: 'Hi', max_output_tokens: 24, top_logprobs: 2,
      reasoning: { effort: 'low' }, temperature: 0 });
    checkOutput(r, 24);
    assert.equal(r.top_logprobs, 2);
    for (const item of r.output.filter((x) => x.type === 'message')) {
      const part = item.content[0];
      assert.ok(part.logprobs.length > 0 || part.text === '', JSON.stringify(part));
      for (const e of part.logprobs) {
        assert.ok(Number.isFinite(e.logprob) && e.logprob <= 0, JSON.stringify(e));
        assert.equal(e.top_logprobs.length, 2);
        assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
      }
    }
  });

  test('stored responses: previous_response_id, retrieve, input items, delete', async () => {
    const first = await client.responses.create({ model: MODEL, input: 'Remember the word kiwi.', max_output_tokens: 6 });
    checkOutput(first, 6);
    assert.equal(first.store, true);
    const got = await client.responses.retrieve(first.id);
    assert.deepEqual(got.output, first.output);
    assert.equal(got.id, first.id);
    const second = await client.responses.create({ model: MODEL, input: 'Which word?', previous_response_id: first.id,
      max_output_tokens: 6 });
    checkOutput(second, 6);
    assert.equal(second.previous_response_id, first.id);
    const counted = await client.responses.inputTokens.count({ model: MODEL, input: 'Which word?',
      previous_response_id: first.id });
    assert.equal(counted.input_tokens, second.usage.input_tokens);
    // The chained prompt is the whole conversation: more input tokens than the first turn's prompt and output.
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
      JSON.stringify([first.usage, second.usage]));
    const items = [];
    for await (const item of client.responses.inputItems.list(second.id, { order: 'asc' })) items.push(item);
    assert.equal(items.length, 1);
    assert.equal(items[0].role, 'user');
    assert.deepEqual(items[0].content, [{ type: 'input_text', text: 'Which word?' }]);
    // Item references: the first turn's items by id count as the items written out.
    const firstInput = [];
    for await (const item of client.responses.inputItems.list(first.id)) firstInput.push(item);
    const byReference = await client.responses.inputTokens.count({ model: MODEL, input: [
      { type: 'item_reference', id: firstInput[0].id }, ...first.output.map((o) => ({ type: 'item_reference', id: o.id })),
      { role: 'user', content: 'Which word?' }] });
    assert.equal(byReference.input_tokens, second.usage.input_tokens);
    await client.responses.delete(first.id);
    await expectApiError(client.responses.retrieve(first.id), 404);
    await expectApiError(client.responses.create({ model: MODEL, input: 'x', previous_response_id: first.id }), 404,
      'previous_response_id');
    // The second response still holds the whole conversation.
    checkOutput(await client.responses.create({ model: MODEL, input: 'Again?', previous_response_id: second.id,
      max_output_tokens: 4 }), 4);
  });

  test('background responses: poll, stream again, cancel', async () => {
    const queued = await client.responses.create({ model: MODEL, input: 'Hi', max_output_tokens: 8, background: true });
    assert.equal(queued.background, true);
    assert.ok(['queued', 'in_progress'].includes(queued.status), queued.status);
    let r = queued;
    for (let i = 0; i < 600 && ['queued', 'in_progress'].includes(r.status); ++i) {
      await sleep(50);
      r = await client.responses.retrieve(queued.id);
    }
    checkOutput(r, 8);
    const replay = await client.responses.retrieve(queued.id, { stream: true, starting_after: 1 });
    const types = [];
    for await (const e of replay) types.push(e.type);
    assert.equal(types[0], 'response.in_progress');  // events 0 and 1 (created, queued) skipped
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.join());

    // Background and streamed: the events as they come through the SDK's stream, then the same response polled.
    const bgStream = await client.responses.create({ model: MODEL, input: 'Hi', max_output_tokens: 8, background: true,
      stream: true });
    let last;
    const seen = [];
    for await (const e of bgStream) last = e, seen.push(e);
    assert.deepEqual(seen.slice(0, 3).map((e) => e.type), ['response.created', 'response.queued', 'response.in_progress']);
    assert.equal(seen[0].response.status, 'queued');
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
    assert.equal(last.response.background, true);
    assert.deepEqual((await client.responses.retrieve(last.response.id)).output, last.response.output);

    const long = await client.responses.create({ model: MODEL, input: 'Write a long story.', max_output_tokens: 4000,
      background: true });
    const cancelled = await client.responses.cancel(long.id);
    assert.ok(['cancelled', 'completed', 'incomplete'].includes(cancelled.status), cancelled.status);
    assert.equal((await client.responses.retrieve(long.id)).status, cancelled.status);
    await assertEngineIdle();
    assert.equal((await client.responses.cancel(queued.id)).status, r.status);  // a finished one: as it is
  });
});

describe('completions', () => {
  test('text prompt with logprobs', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'The quick brown fox', max_tokens: 8,
      logprobs: 1, temperature: 0.5 });
    assert.equal(r.object, 'text_completion');
    const c = r.choices[0];
    assert.equal(typeof c.text, 'string');
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    assert.equal(c.logprobs.tokens.length, r.usage.completion_tokens);
    assert.equal(c.logprobs.token_logprobs.length, r.usage.completion_tokens);
    assert.ok(r.usage.completion_tokens <= 8);
    if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 8);
  });

  test('token-id prompt, streamed with usage', async () => {
    const stream = await client.completions.create({ model: MODEL, prompt: [200006, 1428, 200008, 12194],
      max_tokens: 8, logprobs: 0, stream: true, stream_options: { include_usage: true } });
    let tokens = 0;
    let usage;
    let finish;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.logprobs) tokens += c.logprobs.tokens.length;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(finish);
    assert.equal(usage.prompt_tokens, 4);
    assert.equal(tokens, usage.completion_tokens);
  });

  test('lm-evaluation-harness loglikelihood form: echo, logprobs 1, max_tokens 1; vLLM prompt_logprobs', async () => {
    const prompt = [200006, 1428, 200008, 12194, 11, 2375];
    const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 1, logprobs: 1, echo: true,
      temperature: 0, seed: 1234, prompt_logprobs: 2 });
    const c = r.choices[0];
    const lp = c.logprobs;
    assert.equal(lp.token_logprobs.length, prompt.length + 1);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    for (let i = 1; i <= prompt.length; ++i) {
      assert.ok(Number.isFinite(lp.token_logprobs[i]) && lp.token_logprobs[i] <= 0, `entry ${i}`);
      // lm-eval's greedy check: the token's logprob against the best of top_logprobs.
      assert.ok(Math.max(...Object.values(lp.top_logprobs[i])) >= lp.token_logprobs[i]);
    }
    assert.equal(c.prompt_logprobs.length, prompt.length);
    assert.equal(c.prompt_logprobs[0], null);
    // The scored prompt matches the echoed entries (same logits, same positions).
    for (let i = 1; i < prompt.length; ++i)
      assert.equal(c.prompt_logprobs[i][String(prompt[i])].logprob, lp.token_logprobs[i]);
    assert.ok(c.text.length > 0);
    assert.equal(r.usage.prompt_tokens, prompt.length);
  });

  test('guided_choice and guided_regex hold the output', async () => {
    const choice = await client.completions.create({ model: MODEL, prompt: 'Pick:', max_tokens: 8,
      temperature: 1, guided_choice: ['red', 'green', 'blue'] });
    if (choice.choices[0].finish_reason === 'stop') assert.ok(['red', 'green', 'blue'].includes(choice.choices[0].text));
    else assert.match(choice.choices[0].text, /^(r|re|red|g|gr|gre|gree|green|b|bl|blu|blue)?$/);
    const regex = await client.completions.create({ model: MODEL, prompt: 'Code:', max_tokens: 12,
      temperature: 1, guided_regex: '[A-Z]{2}-[0-9]{3}' });
    const t = regex.choices[0].text;
    if (regex.choices[0].finish_reason === 'stop') assert.match(t, /^[A-Z]{2}-[0-9]{3}$/);
    else assert.match(t, /^[A-Z]{0,2}(-[0-9]{0,3})?$/);
    await expectApiError(client.completions.create({ model: MODEL, prompt: 'x', guided_regex: '(?=a)b' }), 400,
      'guided_regex');
  });

  test('guided_grammar (GBNF) holds the output, chat and completions', async () => {
    const grammar = 'root ::= "[" item ("," item){0,2} "]"\nitem ::= [a-c] | root';
    // The grammar's language by recursive descent: the index after a list at i, or -1.
    const list = (t, i) => {
      if (t[i] !== '[') return -1;
      for (let k = 0, j = i + 1; k < 3; ++k) {
        j = /[a-c]/.test(t[j] ?? '') ? j + 1 : list(t, j);
        if (j < 0) return -1;
        if (t[j] === ']') return j + 1;
        if (t[j] !== ',' || k === 2) return -1;
        j += 1;
      }
      return -1;
    };
    const r = await client.completions.create({ model: MODEL, prompt: 'List:', max_tokens: 16, temperature: 1,
      guided_grammar: grammar });
    const t = r.choices[0].text;
    assert.ok(t.startsWith('['), t);
    if (r.choices[0].finish_reason === 'stop') assert.equal(list(t, 0), t.length, t);
    assert.match(t, /^[\[\],a-c]*$/);
    const c = await client.chat.completions.create({ model: MODEL, max_tokens: 24, temperature: 1,
      messages: [{ role: 'user', content: 'List?' }], structured_outputs: { grammar } });
    assert.equal(c.choices.length, 1);
    await expectApiError(client.completions.create({ model: MODEL, prompt: 'x', guided_grammar: 'root ::= a' }), 400,
      'guided_grammar');
  });

  test('structural tags hold the output (vLLM\'s structured_outputs string, chat response_format)', async () => {
    // One call forced at once and nothing after it: the begin, the JSON arguments, the end.
    const format = { type: 'triggered_tags', triggers: ['<f='], at_least_one: true, stop_after_first: true,
      tags: [{ type: 'tag', begin: '<f=pick>', end: '</f>', content: { type: 'json_schema',
        json_schema: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] } } }] };
    const r = await client.completions.create({ model: MODEL, prompt: 'Call:', max_tokens: 24, temperature: 1,
      structured_outputs: { structural_tag: JSON.stringify({ type: 'structural_tag', format }) } });
    const t = r.choices[0].text;
    assert.ok('<f=pick>'.startsWith(t) || t.startsWith('<f=pick>'), t);
    if (r.choices[0].finish_reason === 'stop') {
      assert.ok(t.endsWith('</f>'), t);
      assert.equal(typeof JSON.parse(t.slice(8, -4)).n, 'number', t);
    }
    // Chat's response_format form (vLLM's example shape): free text with tool calls in it.
    const c = await client.chat.completions.create({ model: MODEL, max_tokens: 24, temperature: 1,
      messages: [{ role: 'user', content: 'Weather?' }],
      response_format: { type: 'structural_tag', triggers: ['<function='], structures: [{ begin: '<function=w>',
        schema: { type: 'object', properties: { city: { type: 'string' } } }, end: '</function>' }] } });
    assert.equal(c.choices.length, 1);
    await expectApiError(client.chat.completions.create({ model: MODEL, max_tokens: 4,
      messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'structural_tag', format: { type: 'token', token: 1 } } }), 400,
    'response_format.format.type');
  });
});

describe('vLLM request extensions', () => {
  test('return_token_ids, continue_final_message with echo, continuous usage, request_id, cache_salt', async () => {
    const messages = [{ role: 'user', content: 'Finish the sentence.' },
                      { role: 'assistant', content: 'The lighthouse keeper' }];
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0,
      continue_final_message: true, add_generation_prompt: false, echo: true, return_token_ids: true,
      request_id: 'e2e-1', cache_salt: 'tenant-e2e' });
    assert.equal(r.id, 'chatcmpl-e2e-1');
    const content = r.choices[0].message.content;
    // The answer opens with the continued text (unless the model closed the message at once).
    if (content !== null) assert.ok(content.startsWith('The lighthouse keeper'), content);
    assert.equal(r.prompt_token_ids.length, r.usage.prompt_tokens);
    assert.equal(r.choices[0].token_ids.length, r.usage.completion_tokens);
    // Streamed: the same tokens; usage in every chunk, the request's so far.
    const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0,
      continue_final_message: true, echo: true, return_token_ids: true, stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true } });
    const ids = [];
    let last = -1;
    for await (const chunk of stream) {
      assert.ok(chunk.usage && chunk.usage.completion_tokens >= last, JSON.stringify(chunk));
      last = chunk.usage.completion_tokens;
      for (const c of chunk.choices) ids.push(...(c.token_ids ?? []));
    }
    assert.deepEqual(ids, r.choices[0].token_ids);
    await expectApiError(client.chat.completions.create({ model: MODEL, messages: [messages[0]], max_tokens: 2,
      continue_final_message: true }), 400, 'messages[0].role');
  });
});

describe('bad input', () => {
  const chat = (body) => client.chat.completions.create({ model: MODEL, max_tokens: 4, ...body });

  test('validation errors through the client: 400 with param', async () => {
    const user = [{ role: 'user', content: 'x' }];
    await expectApiError(client.chat.completions.create({ model: MODEL }), 400, 'messages');
    await expectApiError(chat({ messages: [] }), 400, 'messages');
    await expectApiError(chat({ messages: 'hello' }), 400, 'messages');
    await expectApiError(chat({ messages: [{ role: 'robot', content: 'x' }] }), 400, 'messages[0].role');
    await expectApiError(chat({ messages: [{ role: 'user', content: 7 }] }), 400, 'messages[0].content');
    await expectApiError(chat({ messages: user, temperature: 'hot' }), 400, 'temperature');
    await expectApiError(chat({ messages: user, max_tokens: 0 }), 400, 'max_tokens');
    await expectApiError(chat({ messages: user, max_tokens: -1 }), 400, 'max_tokens');
    await expectApiError(chat({ messages: user, max_tokens: undefined, max_completion_tokens: 0 }), 400,
                         'max_completion_tokens');
    await expectApiError(chat({ messages: user, n: 129 }), 400, 'n');
    await expectApiError(chat({ messages: user, top_logprobs: 2 }), 400, 'top_logprobs');
    await expectApiError(client.responses.create({ model: MODEL }), 400, 'input');
    await expectApiError(client.responses.create({ model: MODEL, input: 'x', max_output_tokens: 0 }), 400,
                         'max_output_tokens');
    await expectApiError(client.completions.create({ model: MODEL, prompt: [1, 2, 999999] }), 400, 'prompt[2]');
    await expectApiError(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: -2 }), 400, 'max_tokens');
  });

  test('prompt over the context: 400 context_length_exceeded', async () => {
    const ids = Array.from({ length: maxModelLen + 8 }, (_, i) => 1000 + (i % 5000));
    await assert.rejects(client.completions.create({ model: MODEL, prompt: ids, max_tokens: 1 }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.code, 'context_length_exceeded');
      return true;
    });
    await assert.rejects(chat({ messages: [{ role: 'user', content: 'x' }], max_tokens: maxModelLen }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.code, 'context_length_exceeded');
      return true;
    });
  });

  test('malformed JSON, invalid UTF-8, oversized body, unknown route, wrong method', async () => {
    let r = await rawError('POST', '/v1/chat/completions', '{"messages": [');
    assert.equal(r.status, 400);
    r = await rawError('POST', '/v1/chat/completions', '[1, 2, 3]');
    assert.equal(r.status, 400);
    const badUtf8 = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xc3, 0x28]),
                                   Buffer.from('"}]}')]);
    r = await rawError('POST', '/v1/chat/completions', badUtf8);
    assert.equal(r.status, 400);
    r = await rawError('POST', '/v1/completions', Buffer.from([0xff, 0xfe, 0x7b]));
    assert.equal(r.status, 400);
    const big = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(MAX_BODY + 10) }] });
    r = await rawError('POST', '/v1/chat/completions', big);
    assert.equal(r.status, 413);
    r = await rawError('POST', '/v1/nothing', '{}');
    assert.equal(r.status, 404);
    r = await rawError('GET', '/v1/chat/completions', undefined, {});
    assert.equal(r.status, 405);
    assert.equal(r.headers.get('allow'), 'POST');
    r = await rawError('DELETE', '/v1/models', undefined, {});
    assert.equal(r.status, 405);
    // The server is still fine.
    const ok = await chat({ messages: [{ role: 'user', content: 'still there?' }] });
    assert.equal(ok.object, 'chat.completion');
  });
});

describe('metrics', () => {
  test('Prometheus text with the request, token and latency series', async () => {
    const m = await assertEngineIdle();
    for (const name of ['gptoss_http_requests_total{endpoint="/v1/chat/completions",status="200"}',
      'gptoss_http_requests_total{endpoint="/v1/chat/completions",status="400"}',
      'gptoss_prompt_tokens_total', 'gptoss_generation_tokens_total',
      'gptoss_time_to_first_token_seconds_bucket{le="+Inf"}', 'gptoss_inter_token_latency_seconds_count',
      'gptoss_queue_depth', 'gptoss_running_sequences', 'gptoss_kv_blocks_in_use']) {
      assert.ok(m.text.includes(name), name);
    }
    assert.ok(m.value('gptoss_generation_tokens_total') > 0);
    assert.ok(m.value('gptoss_kv_blocks_total') > 0);
    assert.ok(m.text.includes('gptoss_spec_decode_draft_tokens_total'));
    assert.ok(m.value('gptoss_spec_decode_accepted_tokens_total') <= m.value('gptoss_spec_decode_draft_tokens_total'));
  });
});

describe('load', () => {
  test('64 concurrent streaming clients, some disconnecting early: consistent usage, no KV leak',
       { timeout: 150000 }, async () => {
    const N = 64;
    const MAX = 12;
    const runs = Array.from({ length: N }, async (_, i) => {
      const abortEarly = i % 5 === 0;
      const controller = new AbortController();
      const chatApi = i % 2 === 0;
      const stream = chatApi
        ? await client.chat.completions.create({ model: MODEL, max_tokens: MAX, stream: true,
            stream_options: { include_usage: true }, messages: [{ role: 'user', content: `Client ${i} says hi.` }] },
          { signal: controller.signal })
        : await client.completions.create({ model: MODEL, prompt: `Client ${i}:`, max_tokens: MAX, logprobs: 0,
            stream: true, stream_options: { include_usage: true } }, { signal: controller.signal });
      let chunks = 0;
      let tokens = 0;
      let usage;
      let finish;
      try {
        for await (const chunk of stream) {
          if (abortEarly && ++chunks >= 2) {
            controller.abort();
            break;
          }
          if (chunk.usage) usage = chunk.usage;
          for (const c of chunk.choices) {
            if (c.finish_reason) finish = c.finish_reason;
            if (!chatApi && c.logprobs) tokens += c.logprobs.tokens.length;
          }
        }
      } catch (e) {
        if (!abortEarly) throw e;
      }
      if (abortEarly) return 'aborted';
      assert.ok(finish, `client ${i} got a finish_reason`);
      assert.ok(usage && usage.completion_tokens > 0 && usage.completion_tokens <= MAX, `client ${i} usage`);
      if (finish === 'length') assert.equal(usage.completion_tokens, MAX);
      if (!chatApi) assert.equal(tokens, usage.completion_tokens, `client ${i}: streamed tokens == usage`);
      return 'complete';
    });
    const results = await Promise.all(runs);
    assert.equal(results.filter((r) => r === 'complete').length, N - Math.ceil(N / 5));
    await assertEngineIdle();
  });
});

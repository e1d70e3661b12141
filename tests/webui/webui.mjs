// The chat page in headless chromium (run by run.sh, which starts the servers):
//   SLUICE_URL        a server on the built-in model, no key, --cached-tokens-granularity 1
//   SLUICE_KEYED_URL  a server on the tiny model with the key SLUICE_KEY
//   CHROMIUM, SCREENSHOT_DIR
// Each step drives the page as a person would (typing, clicking) and checks what it shows
// against what the server says. Throughout: no console error, no page error, no request to any
// host but the server's.
import assert from 'node:assert/strict';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const base = process.env.SLUICE_URL;
const keyedBase = process.env.SLUICE_KEYED_URL;
const key = process.env.SLUICE_KEY;
const shots = process.env.SCREENSHOT_DIR;
assert.ok(base && keyedBase && key && shots && process.env.CHROMIUM, 'run by tests/webui/run.sh');

const problems = [];   // console errors, page errors, requests to other hosts
let allowed = [];      // console errors a step expects (a refused key's 401)

function watch(page, origin) {
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    if (allowed.some((re) => re.test(m.text()))) return;
    problems.push('console error: ' + m.text());
  });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol !== 'data:' && u.origin !== origin) problems.push('request to another host: ' + r.url());
  });
}

const step = (name) => console.log('== ' + name);
const shot = (page, name) => page.screenshot({ path: path.join(shots, name + '.png') });

// Until fn() (evaluated in the page) is truthy.
async function until(page, fn, arg, timeout = 60000) {
  await page.waitForFunction(fn, { timeout, polling: 50 }, arg);
}

const lastReplyDone = () => {
  const r = [...document.querySelectorAll('.msg.assistant')].pop();
  return r && r.dataset.state !== 'streaming' && document.body.dataset.busy === '';
};

async function setSetting(page, id, value) {
  const open = await page.$eval('#settings', (s) => !s.hidden);
  if (!open) await page.click('#settings-toggle');
  if (typeof value === 'boolean') {
    const now = await page.$eval('#' + id, (e) => e.checked);
    if (now !== value) await page.click('#' + id);
  } else {
    await page.$eval('#' + id, (e) => { e.value = ''; });
    await page.type('#' + id, String(value));
    await page.$eval('#' + id, (e) => e.dispatchEvent(new Event('change')));
  }
  await page.click('#settings-toggle');
}

async function sendPrompt(page, text) {
  await page.click('#prompt');
  await page.type('#prompt', text);
  await page.click('#send');
}

const stored = (page) => page.evaluate(() => ({
  conversations: JSON.parse(localStorage.getItem('sluice.conversations') || '[]'),
  current: JSON.parse(localStorage.getItem('sluice.current') || '""'),
}));

async function slotsBusy() {
  const slots = await (await fetch(base + '/slots')).json();
  return slots.some((s) => s.is_processing);
}

async function firstTurn(page) {
  step('a prompt typed and sent: its reply streams in, with the server\'s figures');
  await setSetting(page, 'temperature', 0);
  await setSetting(page, 'max-tokens', 96);
  // Every length the reply's text takes on screen while it streams.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const a = [...document.querySelectorAll('.msg.assistant .answer')].pop();
      const n = a ? a.textContent.length : 0;
      if (n && window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  await sendPrompt(page, 'def fibonacci(n):');
  await until(page, lastReplyDone);
  const lengths = await page.evaluate(() => window.__lengths);
  // At least one state before the last: the text grew while the reply streamed (a page that
  // waits for the whole answer shows one length; a broken stream reader none).
  assert.ok(lengths.length >= 2, 'the reply arrived in steps, not at once: ' + JSON.stringify(lengths));
  console.log('   the reply took ' + lengths.length + ' lengths on screen as it streamed');
  const stats = await page.$eval('.msg.assistant .stats', (s) => ({ ...s.dataset, text: s.textContent }));
  assert.ok(Number(stats.prompt) > 0 && Number(stats.tps) > 0 && stats.ttft !== undefined, JSON.stringify(stats));
  assert.match(stats.text, /prompt \d+ tokens .*tok\/s .*first token \d+ ms/);
  // What the page assembled from the stream is the server's own greedy answer to the same request.
  const { conversations } = await stored(page);
  const reply = conversations[0].messages[1];
  const resp = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'def fibonacci(n):' }], temperature: 0, max_tokens: 96,
                           reasoning_effort: 'none' }) });
  const direct = await resp.json();
  assert.equal(reply.content, direct.choices[0].message.content, 'the page shows the answer the server gives');
  assert.equal(Number(stats.prompt), direct.usage.prompt_tokens);
  await shot(page, 'reply');
}

async function stopALongReply(page) {
  step('a long reply stopped: the server frees the slot');
  await setSetting(page, 'max-tokens', 4000);
  await sendPrompt(page, 'Write a long module with many functions.');
  await until(page, () => {
    const a = [...document.querySelectorAll('.msg.assistant .answer')].pop();
    return a && a.textContent.length > 20;
  });
  assert.ok(await slotsBusy(), 'the server is generating the reply');
  await page.click('#stop');
  await until(page, lastReplyDone, undefined, 5000);
  const t0 = Date.now();
  while (await slotsBusy()) {
    assert.ok(Date.now() - t0 < 3000, 'the slot is still busy 3 s after Stop');
    await new Promise((r) => setTimeout(r, 50));
  }
  const state = await page.$eval('.msg.assistant:last-child', (m) => m.dataset.state);
  assert.equal(state, 'stopped');
  assert.match(await page.$eval('.msg.assistant:last-child .stats', (s) => s.textContent), /stopped/);
  await shot(page, 'stopped');
}

async function secondTurn(page) {
  step('a next turn reuses the conversation\'s cached tokens');
  await setSetting(page, 'max-tokens', 24);
  await sendPrompt(page, 'Now test it.');
  await until(page, lastReplyDone);
  const cached = await page.$eval('.msg.assistant:last-child .stats', (s) => Number(s.dataset.cached));
  assert.ok(cached > 0, 'cached tokens of the second turn: ' + cached);
  assert.match(await page.$eval('.msg.assistant:last-child .stats', (s) => s.textContent), new RegExp('cached ' + cached));
}

async function reloadAndEdit(page) {
  step('reloaded: the conversation is still there; the last message edited and resent');
  const before = await page.$$eval('#messages .msg', (ms) => ms.map((m) => m.textContent));
  await page.reload();
  await until(page, () => document.getElementById('model').dataset.ready === '1');
  const after = await page.$$eval('#messages .msg', (ms) => ms.map((m) => m.textContent));
  assert.deepEqual(after, before);
  assert.equal(await page.$$eval('.conv-item', (l) => l.length), 1);
  assert.equal(await page.$eval('.conv-item .open', (b) => b.textContent), 'def fibonacci(n):');
  await shot(page, 'reloaded');

  await page.click('.msg.user:nth-last-child(2) .edit');
  await page.$eval('.edit-box', (e) => { e.value = ''; });
  await page.type('.edit-box', 'Now document it.');
  await page.click('.resend');
  await until(page, lastReplyDone);
  const { conversations } = await stored(page);
  const msgs = conversations[0].messages;
  assert.equal(msgs.length, 6, 'the edited turn replaced the last one');
  assert.equal(msgs[4].content, 'Now document it.');
  assert.equal(msgs[5].state, 'done');
}

async function thinking(page) {
  step('thinking on: the reasoning is shown folded');
  await setSetting(page, 'thinking', true);
  await setSetting(page, 'max-tokens', 24);
  await page.click('#new-chat');
  await sendPrompt(page, 'Think about sorting.');
  await until(page, lastReplyDone);
  const r = await page.$eval('.msg.assistant:last-child details.reasoning',
                             (d) => ({ hidden: d.hidden, open: d.open, text: d.querySelector('.text').textContent }));
  assert.ok(!r.hidden && !r.open && r.text.length > 0, JSON.stringify(r));
  await setSetting(page, 'thinking', false);
  assert.equal(await page.$$eval('.conv-item', (l) => l.length), 2);
}

const HOSTILE_CONTENT = 'Here: <img src=x onerror="window.__pwned=\'content\'"> and <script>window.__pwned=\'script\'</script>\n\n' +
  '```html\n<img src=x onerror="window.__pwned=\'code\'"><iframe src="javascript:window.__pwned=1"></iframe>\n```\n' +
  'inline `<b onmouseover="window.__pwned=\'inline\'">x</b>` end';
const HOSTILE_REASONING = '<svg onload="window.__pwned=\'svg\'"></svg><img src=x onerror="window.__pwned=\'reasoning\'">';

function hostileStream() {
  const chunk = (delta, extra = {}) => 'data: ' + JSON.stringify({ choices: [{ index: 0, delta, finish_reason: null }], ...extra }) + '\n\n';
  return chunk({ role: 'assistant', content: '' }) + chunk({ reasoning_content: HOSTILE_REASONING }) +
    chunk({ content: HOSTILE_CONTENT }) +
    'data: ' + JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
                                 timings: { predicted_per_second: 1, prompt_ms: 1, predicted_n: 1 } }) + '\n\n' +
    'data: [DONE]\n\n';
}

async function assertNothingRan(page, what) {
  await new Promise((r) => setTimeout(r, 300));
  const s = await page.evaluate(() => ({
    pwned: window.__pwned,
    elements: document.querySelectorAll('#app img, #app script, #app svg, #app iframe, #app b').length,
  }));
  assert.equal(s.pwned, undefined, what + ': a handler ran');
  assert.equal(s.elements, 0, what + ': markup from text became elements');
}

async function hostileContent(page) {
  step('hostile text from the model, the user and storage is shown, not run');
  await page.setRequestInterception(true);
  const handler = (req) => {
    if (req.method() === 'POST' && req.url().endsWith('/v1/chat/completions'))
      req.respond({ status: 200, contentType: 'text/event-stream', body: hostileStream() });
    else req.continue();
  };
  page.on('request', handler);
  await page.click('#new-chat');
  await sendPrompt(page, '<img src=x onerror="window.__pwned=\'user\'"> <script>window.__pwned=\'user2\'</script>');
  await until(page, lastReplyDone);
  page.off('request', handler);
  await page.setRequestInterception(false);
  await page.click('.msg.assistant:last-child summary');
  await assertNothingRan(page, 'a live reply');
  const answer = await page.$eval('.msg.assistant:last-child .answer', (a) => a.textContent);
  assert.ok(answer.includes('<img src=x onerror="window.__pwned=\'content\'">'), answer);
  assert.ok(answer.includes('<script>window.__pwned=\'script\'</script>'), answer);
  assert.equal(await page.$$eval('.msg.assistant:last-child .answer pre code', (c) => c.length), 1, 'the code block');
  const reasoning = await page.$eval('.msg.assistant:last-child .reasoning .text', (t) => t.textContent);
  assert.equal(reasoning, HOSTILE_REASONING);
  await shot(page, 'hostile');
  // The code block's Copy puts its text, as text, on the clipboard.
  await page.browserContext().overridePermissions(new URL(base).origin, ['clipboard-read', 'clipboard-write',
                                                                          'clipboard-sanitized-write']);
  await page.click('.msg.assistant:last-child .answer pre .copy');
  await until(page, () => document.querySelector('.msg.assistant:last-child .answer pre .copy').textContent === 'Copied',
              undefined, 5000);
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  assert.equal(copied, '<img src=x onerror="window.__pwned=\'code\'"><iframe src="javascript:window.__pwned=1"></iframe>');
  await assertNothingRan(page, 'a copied code block');

  // Stored: the same conversation read back, and a title planted in storage.
  await page.evaluate(() => {
    const list = JSON.parse(localStorage.getItem('sluice.conversations'));
    list.push({ id: 'planted', title: '<img src=x onerror="window.__pwned=\'title\'">', updated: 1,
                messages: [{ role: 'user', content: '<script>window.__pwned=1</script>' },
                           { role: 'assistant', content: '<img src=x onerror="window.__pwned=2">', state: 'done' }] });
    localStorage.setItem('sluice.conversations', JSON.stringify(list));
  });
  await page.reload();
  await until(page, () => document.getElementById('model').dataset.ready === '1');
  await assertNothingRan(page, 'the stored conversation');
  await page.click('.conv-item[data-id="planted"] .open');
  await assertNothingRan(page, 'a planted conversation');
  await page.click('.conv-item[data-id="planted"] .delete');
}

async function phone(page) {
  step('a phone-width screen');
  await page.setViewport({ width: 390, height: 844, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
  await page.reload();
  await until(page, () => document.getElementById('model').dataset.ready === '1');
  const fit = await page.evaluate(() => {
    const r = (id) => document.getElementById(id).getBoundingClientRect();
    return { width: document.documentElement.scrollWidth, send: r('send').right, prompt: r('prompt').width,
             sidebar: r('sidebar').right };
  });
  assert.ok(fit.width <= 390 && fit.send <= 390 && fit.prompt > 150 && fit.sidebar <= 0, JSON.stringify(fit));
  await shot(page, 'phone');
  await page.click('#menu');
  await until(page, () => document.getElementById('sidebar').getBoundingClientRect().left >= 0, undefined, 3000);
  await shot(page, 'phone-conversations');
  await page.click('#menu');
}

async function keyPrompt(browser) {
  step('a server with a key: the page asks for it, refuses a wrong one, keeps the right one in the browser');
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  watch(page, new URL(keyedBase).origin);
  await page.goto(keyedBase, { waitUntil: 'load' });
  await until(page, () => document.getElementById('key-dialog').open, undefined, 10000);
  await shot(page, 'key');
  allowed = [/status of 401/];
  await page.type('#key-input', 'not-the-key');
  await page.click('#key-save');
  await until(page, () => document.getElementById('key-dialog').open &&
                          document.getElementById('key-error').textContent.includes('refused'), undefined, 10000);
  allowed = [];
  await page.type('#key-input', key);
  await page.click('#key-save');
  await until(page, () => document.getElementById('model').dataset.ready === '1', undefined, 10000);
  await sendPrompt(page, 'hello');
  await until(page, lastReplyDone);
  assert.equal(await page.$eval('.msg.assistant:last-child', (m) => m.dataset.state), 'done');
  assert.equal(await page.evaluate(() => JSON.parse(localStorage.getItem('sluice.apiKey'))), key);
  await context.close();
}

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check',
         '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-extensions',
         '--disable-default-apps', '--disable-features=Translate,MediaRouter,OptimizationHints'],
});
let page;
try {
  page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 760 });
  watch(page, new URL(base).origin);
  step('the page loads from ' + base);
  await page.goto(base, { waitUntil: 'load' });
  await until(page, () => document.getElementById('model').dataset.ready === '1', undefined, 10000);
  assert.match(await page.$eval('#model', (m) => m.textContent), /deepseek41-python-26m/);
  await shot(page, 'empty');
  await firstTurn(page);
  await stopALongReply(page);
  await secondTurn(page);
  await reloadAndEdit(page);
  await thinking(page);
  await hostileContent(page);
  await phone(page);
  await keyPrompt(browser);
  assert.deepEqual(problems, [], 'no console errors, page errors or requests to other hosts');
  console.log('webui.mjs: all passed');
} catch (e) {
  if (page) await shot(page, 'failure').catch(() => {});
  console.error('webui.mjs: FAIL: ' + (e.stack || e));
  if (problems.length) console.error(problems.join('\n'));
  process.exitCode = 1;
} finally {
  await browser.close();
}

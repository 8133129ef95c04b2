// Drives cairn's dashboard in headless Chromium (Debian's /usr/bin/chromium) through
// playwright-core, against a running coordinator or `cairn run --rest` whose job `--job` is
// back-pressured: the job is listed, its graph shows `--slow-vertex` as back-pressured and
// `--calm-vertex` not, the checkpoint charts have points, a savepoint and then a
// stop-with-savepoint are taken from the page's buttons, and the job ends FINISHED. Saves a
// screenshot of each page in `--out`. With `--failed-job NAME`, then waits for that job's
// failure in its exceptions tab; with `--cancel-job NAME`, cancels that running job from the
// page and sees it CANCELED. Prints one JSON line with what it saw; exits non-zero
// (with the step that failed) otherwise.
//
//   node e2e/dashboard.mjs --url http://127.0.0.1:8081 --out shots --job backpressure \
//     --slow-vertex 'fast-source -> fast-key' --calm-vertex 'count-both -> throttled-sink' \
//     [--failed-job NAME] [--cancel-job NAME] [--token SECRET] [--timeout-ms 60000 (each step)] [--deadline-ms 300000 (in all)]
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';

const { values: args } = parseArgs({
  options: {
    url: { type: 'string' },
    out: { type: 'string' },
    job: { type: 'string' },
    'slow-vertex': { type: 'string' },
    'calm-vertex': { type: 'string' },
    token: { type: 'string' },
    'failed-job': { type: 'string' },
    'cancel-job': { type: 'string' },
    'timeout-ms': { type: 'string', default: '60000' },
    'deadline-ms': { type: 'string', default: '300000' },
    chromium: { type: 'string', default: process.env.CAIRN_CHROMIUM || '/usr/bin/chromium' },
  },
});
for (const required of ['url', 'out', 'job', 'slow-vertex', 'calm-vertex']) {
  if (!args[required]) {
    console.error(`error: --${required} is required`);
    process.exit(2);
  }
}
const timeout = Number(args['timeout-ms']);
setTimeout(() => {
  console.error(`dashboard test failed: not done within ${args['deadline-ms']} ms`);
  process.exit(1);
}, Number(args['deadline-ms'])).unref();
mkdirSync(args.out, { recursive: true });

let step = 'launching Chromium';
const seen = { consoleErrors: [] };
const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  // This machine's network is closed: no background connections, no sandbox as root.
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});

async function shot(page, name) {
  const path = join(args.out, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}

try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.setDefaultTimeout(timeout);
  // Script errors, not the 401s the page answers by asking for the token.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) {
      seen.consoleErrors.push(m.text());
    }
  });
  page.on('pageerror', (e) => seen.consoleErrors.push(String(e)));
  // The confirmations of stop and cancel.
  page.on('dialog', (d) => d.accept());
  seen.screenshots = [];

  step = 'loading the dashboard';
  await page.goto(args.url);
  if (args.token) {
    step = 'giving the token the dashboard asks for';
    await page.waitForSelector('form.token-form');
    seen.screenshots.push(await shot(page, '0-token'));
    await page.fill('form.token-form input[name=token]', args.token);
    await page.click('form.token-form button[type=submit]');
  }

  step = `finding the RUNNING job ${args.job} in the job list`;
  const row = `tr.job-row[data-name="${args.job}"]`;
  await page.waitForSelector(`${row} [data-state=RUNNING]`);
  seen.jid = await page.getAttribute(row, 'data-jid');
  seen.screenshots.push(await shot(page, '1-jobs'));

  step = 'opening the job';
  await page.click(`${row} a`);
  await page.waitForSelector('.graph .vertex');

  step = `waiting for ${args['slow-vertex']} to show as back-pressured in the graph`;
  const vertex = (name) => `.graph .vertex[data-vertex-name="${name}"]`;
  await page.waitForSelector(`${vertex(args['slow-vertex'])}[data-backpressure=high]`);
  step = `waiting for ${args['calm-vertex']} to show as not back-pressured`;
  await page.waitForSelector(`${vertex(args['calm-vertex'])}[data-backpressure=ok]`);
  seen.vertices = await page.$$eval('.graph .vertex', (nodes) =>
    nodes.map((n) => ({ name: n.dataset.vertexName, backpressure: n.dataset.backpressure })),
  );
  seen.screenshots.push(await shot(page, '2-graph'));

  step = 'waiting for points in the checkpoint charts';
  await page.click('.tabs a[data-tab=checkpoints]');
  await page.waitForFunction(() =>
    ['duration', 'size', 'alignment', 'in-flight'].every(
      (m) => document.querySelectorAll(`.chart[data-metric=${m}] circle.point`).length >= 2,
    ),
  );
  await page.waitForSelector('table.subtasks tbody tr');
  seen.chartPoints = await page.$$eval('.chart[data-metric=duration] circle.point', (c) => c.length);
  seen.subtaskRows = await page.$$eval('table.subtasks tbody tr', (r) => r.length);
  seen.screenshots.push(await shot(page, '3-checkpoints'));

  step = 'looking at the exceptions';
  await page.click('.tabs a[data-tab=exceptions]');
  await page.waitForSelector('text=Restarts');
  seen.screenshots.push(await shot(page, '4-exceptions'));

  step = 'triggering a savepoint from the page';
  await page.click('.tabs a[data-tab=savepoints]');
  await page.click('button[name=savepoint]');
  await page.waitForSelector('.action-result[data-status=ok]');
  await page.waitForSelector('tr.savepoint[data-kind=savepoint][data-status=COMPLETED]');
  seen.savepoint = (await page.textContent('.action-result')).trim();
  seen.screenshots.push(await shot(page, '5-savepoint'));

  step = 'stopping the job with a savepoint from the page';
  await page.click('button[name=stop]');
  await page.waitForSelector('.job-head [data-state=FINISHED]');
  await page.waitForSelector('.action-result[data-status=ok]:has-text("Stopped with a savepoint")');
  await page.waitForSelector('tr.savepoint[data-kind=stop][data-status=COMPLETED]');
  seen.stop = (await page.textContent('.action-result')).trim();
  seen.stopLocation = seen.stop.replace(/^Stopped with a savepoint at /, '');
  seen.screenshots.push(await shot(page, '6-stopped'));

  step = 'seeing the job FINISHED in the job list';
  await page.click('header.top a.brand');
  await page.waitForSelector(`${row} [data-state=FINISHED]`);
  seen.screenshots.push(await shot(page, '7-finished'));

  if (args['failed-job']) {
    const failed = `tr.job-row[data-name="${args['failed-job']}"]`;
    step = `opening the job ${args['failed-job']}`;
    await page.click('header.top a.brand');
    await page.click(`${failed} a`);
    step = `waiting for the failure of ${args['failed-job']} in its exceptions`;
    await page.click('.tabs a[data-tab=exceptions]');
    await page.waitForSelector('table.exceptions tbody tr');
    seen.exceptionKinds = await page.$$eval('table.exceptions tbody tr td:nth-child(2)', (tds) =>
      tds.map((td) => td.textContent.trim()),
    );
    seen.screenshots.push(await shot(page, '8-exceptions'));
  }

  if (args['cancel-job']) {
    const running = `tr.job-row[data-name="${args['cancel-job']}"]`;
    step = `finding the RUNNING job ${args['cancel-job']}`;
    await page.click('header.top a.brand');
    await page.waitForSelector(`${running} [data-state=RUNNING]`);
    await page.click(`${running} a`);
    step = `cancelling ${args['cancel-job']} from the page`;
    await page.click('button[name=cancel]');
    await page.waitForSelector('.job-head [data-state=CANCELED]');
    seen.screenshots.push(await shot(page, '9-canceled'));
  }

  if (seen.consoleErrors.length > 0) {
    step = 'checking the browser console';
    throw new Error(`errors in the browser console: ${seen.consoleErrors.join(' | ')}`);
  }
  console.log(JSON.stringify(seen));
} catch (error) {
  console.error(`dashboard test failed while ${step}: ${error.message}`);
  console.error(JSON.stringify(seen));
  process.exitCode = 1;
} finally {
  await browser.close();
}

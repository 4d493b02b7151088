// Node.js (V8) memory behaviours for the leak corpus (node-agent/corpus/README.md).
//
//   node mem.js MODE key=value...
//
// Sizes take k/m/g (10^3) or Ki/Mi/Gi (2^10) suffixes; times are seconds.
'use strict';

function size(v) {
  const sufs = [['Ki', 1024], ['Mi', 1 << 20], ['Gi', 1 << 30], ['k', 1e3], ['m', 1e6], ['g', 1e9]];
  for (const [s, m] of sufs) if (v.endsWith(s)) return Math.floor(parseFloat(v.slice(0, -s.length)) * m);
  return Math.floor(parseFloat(v));
}

const a = Object.fromEntries(process.argv.slice(3).map((x) => x.split('=', 2)));
const get = (k, d) => (a[k] === undefined ? d : a[k]);

// A request's worth of short-lived garbage: what keeps V8's young generation cycling.
function churn(bytes) {
  let keep = 0;
  for (let i = 0; i < bytes / 1024; i++) {
    const o = { id: i, body: 'r'.repeat(64) + i, parts: new Array(100).fill(i) };
    keep ^= o.parts.length;
  }
  return keep;
}

// An object of about 8 KB on the JS heap.
const record = (i) => ({ id: i, data: new Array(1000).fill(i + 0.5) });

function leak() {
  // Records kept forever at `rate` bytes/s after `delay` s (e.g. a listener never removed).
  const rate = size(get('rate', '1m')), delay = parseFloat(get('delay', '0'));
  const garbage = size(get('churn', '2m'));
  const held = []; const t0 = Date.now(); let owed = 0; let last = null;
  setInterval(() => {
    const now = Date.now();
    churn(garbage / 10);
    if ((now - t0) / 1000 < delay) return;
    if (last !== null) owed += (rate * (now - last)) / 1000;
    last = now;
    while (owed >= 8000) { held.push(record(held.length)); owed -= 8000; }
  }, 100);
}

function warmup() {
  // A service warming up: a cache filled fast at first and slower and slower (95 % of
  // `target` at `secs`), under steady request garbage; then only the garbage.
  const target = size(get('target', '100m')), secs = parseFloat(get('secs', '100'));
  const garbage = size(get('churn', '2m'));
  const cache = new Map(); const t0 = Date.now();
  setInterval(() => {
    const t = (Date.now() - t0) / 1000;
    const want = t >= secs ? target : target * (1 - Math.exp((-3 * t) / secs));
    while (cache.size * 8000 < want) cache.set('k' + cache.size, record(cache.size));
    churn(garbage / 10);
  }, 100);
}

function cycle() {
  // Accumulates `rate` bytes/s of records for `period` s, then drops them: a collector
  // with a very long cycle, or a batch window.
  const rate = size(get('rate', '1m')), period = parseFloat(get('period', '120'));
  let held = []; let t0 = Date.now();
  setInterval(() => {
    const t = (Date.now() - t0) / 1000;
    if (t >= period) { held = []; t0 = Date.now(); return; }
    while (held.length * 8000 < rate * t) held.push(record(held.length));
    churn(200e3);
  }, 100);
}

function steady() {
  // Request garbage only, on a live set of `live` bytes: V8's own sawtooth.
  const live = []; const n = size(get('live', '30m'));
  while (live.length * 8000 < n) live.push(record(live.length));
  const garbage = size(get('churn', '5m'));
  setInterval(() => churn(garbage / 10), 100);
}

const modes = { leak, warmup, cycle, steady };
const mode = process.argv[2];
if (!modes[mode]) { console.error('usage: node mem.js ' + Object.keys(modes).join('|') + ' key=value...'); process.exit(64); }
modes[mode]();

// graphile-worker for pgdrain's `make bench` (bench/graphile.py runs it).
//
//   node drain.mjs enqueue URL N      install the schema and add N no-op jobs (not timed)
//   node drain.mjs drain URL [CONC LOCAL_QUEUE BATCH_DELAY POOL]
//
// `drain` speaks bench/worker.py's protocol: one JSON line {"bench_event": "ready"} once
// set up, waits for a `go` line on stdin, drains with runOnce() (which exits once the queue
// is empty) and prints {"bench_event": "result", ...} with wall-clock start and end, the
// executions its task counted and the distinct job ids it saw.
import { createInterface } from "node:readline";
import pg from "pg";
import { Logger, makeWorkerUtils, runOnce } from "graphile-worker";

const emit = (event, fields = {}) =>
  process.stdout.write(JSON.stringify({ bench_event: event, ...fields }) + "\n");

// Errors and warnings only: the bench reads stdout line by line.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") process.stderr.write(`${message}\n`);
});

async function enqueue(url, count) {
  const utils = await makeWorkerUtils({ connectionString: url, logger });
  try {
    await utils.migrate();
    for (let start = 0; start < count; start += 10_000) {
      const n = Math.min(10_000, count - start);
      await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload: {} })));
    }
  } finally {
    await utils.release();
  }
}

function nextLine() {
  const rl = createInterface({ input: process.stdin });
  // stdin destroyed once read: an open pipe would keep the process alive after the drain.
  return new Promise((resolve) =>
    rl.once("line", () => {
      rl.close();
      process.stdin.destroy();
      resolve();
    }),
  );
}

async function drain(url, concurrency, localQueue, batchDelay, poolSize) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  const report = (error) => process.stderr.write(`pool: ${error}\n`);
  pool.on("error", report);
  pool.on("connect", (client) => client.on("error", report));
  // Every client connected before the clock starts: the drain is timed, not the connects.
  const clients = await Promise.all(Array.from({ length: poolSize }, () => pool.connect()));
  clients.forEach((client) => client.release());
  let executed = 0;
  const ids = new Set();
  const taskList = {
    noop: async (_payload, helpers) => {
      executed += 1;
      ids.add(helpers.job.id);
    },
  };
  const preset = {
    worker: {
      concurrentJobs: concurrency,
      maxPoolSize: poolSize,
      localQueue: localQueue > 0 ? { size: localQueue } : undefined,
      completeJobBatchDelay: batchDelay,
      failJobBatchDelay: batchDelay,
    },
  };
  emit("ready");
  await nextLine();
  const start = Date.now() / 1000;
  const cpuStart = process.cpuUsage();
  await runOnce({ pgPool: pool, preset, taskList, noHandleSignals: true, logger });
  const end = Date.now() / 1000;
  const cpu = process.cpuUsage(cpuStart);
  await pool.end();
  emit("result", {
    start,
    end,
    executed,
    distinct: ids.size,
    cpu_s: (cpu.user + cpu.system) / 1e6,
    rss_mb: process.resourceUsage().maxRSS / 1024,
  });
}

const [mode, url, ...rest] = process.argv.slice(2);
if (mode === "enqueue") {
  await enqueue(url, Number(rest[0]));
} else if (mode === "drain") {
  const [conc = 24, local = 500, delay = 0, pool = 25] = rest.map(Number);
  await drain(url, conc, local, delay, pool);
} else {
  process.stderr.write("usage: node drain.mjs enqueue URL N | drain URL [CONC LOCAL DELAY POOL]\n");
  process.exit(2);
}

/**
 * `weft batches list | show ID | cancel ID`: batches in the database, for
 * operators (every tenant's). A cancel moves the batch to `cancelling`; the
 * running server notices within a second, or the next one to start ends it.
 */
import { Command, InvalidArgumentError } from "commander";
import { batchObject } from "../batch/openai-objects.js";
import { BatchStore } from "../store/batch-store.js";
import { DEFAULT_DB_PATH, escapeName } from "../store/database.js";

function withStore<T>(db: string, fn: (s: BatchStore) => T): T {
  const store = new BatchStore(db);
  try {
    return fn(store);
  } finally {
    store.close();
  }
}

const time = (t: number | null): string => (t === null ? "-" : new Date(t * 1000).toISOString());

export function batchesCommand(): Command {
  const batches = new Command("batches").description("list, inspect and cancel batches (the Batch API's, every tenant's)");
  const db = ["--db <path>", "SQLite database", DEFAULT_DB_PATH] as const;
  batches.command("list").description("list batches, newest first").option(...db)
    .option("--limit <n>", "how many", (v) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("--limit must be an integer ≥ 1");
      return n;
    }, 50)
    .action((o: { db: string; limit: number }) => {
      const rows = withStore(o.db, (s) => s.batches(null, { limit: o.limit }));
      if (rows.length === 0) return console.log("no batches");
      console.log("id\ttenant\tstatus\tendpoint\ttotal\tcompleted\tfailed\tcreated");
      for (const b of rows) console.log([b.id, escapeName(b.tenant), b.status, b.endpoint, b.total, b.completed, b.failed, time(b.createdAt)].join("\t"));
    });
  batches.command("show").description("print one batch as the API's Batch object, with its tenant").argument("<id>").option(...db)
    .action((id: string, o: { db: string }) => {
      const b = withStore(o.db, (s) => s.batch(id, null));
      if (!b) throw new InvalidArgumentError(`no batch ${id}`);
      console.log(JSON.stringify({ ...batchObject(b), tenant: b.tenant }, null, 2));
    });
  batches.command("cancel").description("cancel a batch that is validating or in progress").argument("<id>").option(...db)
    .action((id: string, o: { db: string }) => {
      const outcome = withStore(o.db, (s) => {
        const b = s.batch(id, null);
        if (!b) return `no batch ${id}`;
        return s.transition(id, ["validating", "in_progress"], "cancelling") ? null : `batch ${id} is ${b.status}: it cannot be cancelled`;
      });
      if (outcome) throw new InvalidArgumentError(outcome);
      console.log(`batch ${id} is cancelling: the server ends it within a second (or when it next starts)`);
    });
  return batches;
}

/** A tokenizer pool worker (tokenizer-pool.ts): one call at a time, a TextTokenizer per model directory. */
import { parentPort } from "node:worker_threads";
import { TextTokenizer } from "./tokenizer.js";
import { toWireError, type WorkerReply, type WorkerRequest } from "./tokenizer-pool.js";

const tokenizers = new Map<string, TextTokenizer>();

function tokenizer(dir: string): TextTokenizer {
  let tok = tokenizers.get(dir);
  if (!tok) {
    tok = TextTokenizer.fromDir(dir);
    tokenizers.set(dir, tok);
  }
  return tok;
}

function encode(req: Exclude<WorkerRequest, { kind: "forget" }>): number[] {
  const tok = tokenizer(req.dir);
  return req.kind === "chat" ? tok.encodeChat(req.messages, req.maxChars, req.options) : tok.encode(req.text);
}

const port = parentPort;
if (!port) throw new Error("tokenizer-worker.js runs as a worker thread of TokenizerPool");

port.on("message", (req: WorkerRequest) => {
  if (req.kind === "forget") {
    tokenizers.delete(req.dir);
    return;
  }
  try {
    const ids = new Uint32Array(encode(req));
    port.postMessage({ ids } satisfies WorkerReply, [ids.buffer]);
  } catch (e) {
    port.postMessage({ error: toWireError(e) } satisfies WorkerReply);
  }
});

/**
 * The limits of the HTTP edge, and an answer for every request, in OpenAI's
 * error shape, unless a response to it has already begun:
 * - its headers must arrive within `headersTimeoutMs`, the whole request,
 *   body included, within `requestTimeoutMs` (408): a body that stalls or
 *   trickles is cut. Node checks both timers (clientError).
 * - requests node's parser refuses are answered 400, headers over node's
 *   16 KiB 431 (clientError), a missing Host 400 (node's own check answers
 *   without a body, so it is turned off and made here).
 * - a request for no route is answered 404 before its body is read.
 * - a response that finishes before its request has (401, 404, 413) leaves
 *   the client `earlyAnswerGraceMs` to finish sending, then the connection is
 *   closed: a client can't hold it by trickling.
 * - beyond `maxConnections` open connections, a new connection's request is
 *   answered 503 and the connection closed.
 * Once a request has arrived nothing here times it out: a non-streamed
 * generation writes nothing until it is done, and streams have their own
 * stalled-reader cutoff (sse.ts).
 */
import type { ConnectionError, FastifyHttpOptions, FastifyInstance, FastifyRequest } from "fastify";
import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { apiError, type ApiError } from "./errors.js";

export interface HttpLimits {
  /** Time to receive a request's headers, ms. */
  headersTimeoutMs: number;
  /** Time to receive a whole request, body included, ms; at least `headersTimeoutMs`. */
  requestTimeoutMs: number;
  /** Idle time between requests on a kept-alive connection, ms. */
  keepAliveTimeoutMs: number;
  /** Open connections served; a request on one beyond them gets a 503 (0: no cap). */
  maxConnections: number;
  /** Time a client answered before its body arrived may go on sending before its connection is closed, ms. */
  earlyAnswerGraceMs: number;
}

/** The defaults, each with its reason. */
export const DEFAULT_HTTP_LIMITS: HttpLimits = {
  // Headers are a few hundred bytes sent at once; 10 s allows a bad mobile link, and a client that
  // trickles headers (slowloris) or sends nothing holds a connection no longer. Node's default is 60 s.
  headersTimeoutMs: 10_000,
  // The default 4 MiB body limit at 70 KB/s. Node has no per-chunk idle timer: this is what cuts
  // a body that stalls. Node's default is 300 s, and fastify turns it off.
  requestTimeoutMs: 60_000,
  // Longer than the 60 s idle timeout of common proxies and load balancers (nginx, AWS ALB), so the
  // server never closes a kept-alive connection the proxy is about to reuse (a 502). Fastify's default.
  keepAliveTimeoutMs: 72_000,
  // Room for all the requests an engine holds by default (32 running, 1024 waiting; one connection
  // each) and idle kept-alive connections. Each costs a file descriptor: keep it below `ulimit -n`.
  maxConnections: 4096,
  // Lets an honest client finish a body already in flight (its connection is then kept).
  earlyAnswerGraceMs: 2_000,
};

export type HttpServerOptions = Pick<FastifyHttpOptions<Server>, "connectionTimeout" | "keepAliveTimeout" | "requestTimeout" | "http" | "clientErrorHandler">;

/** The latest request on each connection and its response: whether a parser error may still be answered. */
const exchanges = new WeakMap<Socket, { req: IncomingMessage; res: ServerResponse }>();

/** Fastify factory options for `limits`; spread them into the options given to Fastify(). Throws on inconsistent limits. */
export function httpServerOptions(limits: HttpLimits): HttpServerOptions {
  checkLimits(limits);
  const { headersTimeoutMs, requestTimeoutMs } = limits;
  return {
    // No idle-socket timer: a non-streamed generation is silent until it is done.
    connectionTimeout: 0,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    requestTimeout: requestTimeoutMs,
    http: {
      headersTimeout: headersTimeoutMs,
      requestTimeout: requestTimeoutMs,
      // Node's default (30 s) would let a 10 s header timeout take 40 s: check at a tenth of the shorter timer.
      connectionsCheckingInterval: Math.min(1000, Math.max(10, Math.floor(Math.min(headersTimeoutMs, requestTimeoutMs) / 10))),
      requireHostHeader: false,
    },
    clientErrorHandler: answerClientError,
  };
}

/** Installs the connection cap, the early answers and the missing-Host check. Call before any other hook. */
export function installHttpLimits(app: FastifyInstance, limits: HttpLimits): void {
  const overCap = trackConnections(app.server, limits.maxConnections);
  app.server.on("request", (req: IncomingMessage, res: ServerResponse) => {
    exchanges.set(req.socket, { req, res });
    res.once("finish", () => closeIfStillSending(req, limits.earlyAnswerGraceMs));
  });
  app.addHook("onRequest", async (req, reply) => {
    if (overCap.has(req.raw.socket)) {
      reply.raw.setHeader("connection", "close");
      throw apiError("too_many_connections", {});
    }
    if (req.raw.httpVersion === "1.1" && req.headers.host === undefined) throw apiError("bad_request", { detail: "the Host header is missing" });
  });
  // After every onRequest hook (auth decides first), before the body is read.
  app.addHook("preParsing", async (req) => {
    if (req.is404) throw unroutedError(req);
  });
}

/** The answer to a request that matches no route; the not-found handler gives the same. */
export function unroutedError(req: FastifyRequest): ApiError {
  return apiError("not_found", { method: req.method, path: req.url.split(/[?#]/)[0] ?? "" });
}

function checkLimits(l: HttpLimits): void {
  for (const [name, value] of Object.entries(l)) {
    const min = name === "maxConnections" ? 0 : 1;
    if (!Number.isSafeInteger(value) || value < min) throw new Error(`HTTP limit ${name} must be an integer ≥ ${min} (got ${value})`);
  }
  if (l.headersTimeoutMs > l.requestTimeoutMs) throw new Error("the header timeout must not be longer than the request timeout");
}

/** Counts open connections; returns the set of those opened beyond `cap`. */
function trackConnections(server: Server, cap: number): WeakSet<Socket> {
  const overCap = new WeakSet<Socket>();
  let open = 0;
  server.on("connection", (socket: Socket) => {
    open += 1;
    if (cap > 0 && open > cap) overCap.add(socket);
    socket.once("close", () => {
      open -= 1;
    });
  });
  return overCap;
}

/** A response finished before its request did: the client gets `graceMs` to finish sending, then the connection is closed. */
function closeIfStillSending(req: IncomingMessage, graceMs: number): void {
  if (req.complete) return;
  const timer = setTimeout(() => req.socket.destroy(), graceMs).unref();
  const cancel = (): void => clearTimeout(timer);
  req.once("end", cancel);
  req.socket.once("close", cancel);
}

/** Node's parser refused the request, or a timer ran out: answer in our shape when nothing was written for it yet, and close. */
function answerClientError(err: ConnectionError, socket: Socket): void {
  if (err.code !== "ECONNRESET" && socket.writable && !responseBegun(socket)) socket.write(rawAnswer(clientErrorAnswer(err)));
  socket.destroy();
}

/** Whether a response to the request now arriving was begun, or one is still being written: then no other may be. */
function responseBegun(socket: Socket): boolean {
  const x = exchanges.get(socket);
  return x !== undefined && x.res.headersSent && !(x.req.complete && x.res.writableFinished);
}

function clientErrorAnswer(err: ConnectionError): ApiError {
  switch (err.code) {
    case "ERR_HTTP_REQUEST_TIMEOUT": return apiError("request_timeout", {});
    case "HPE_HEADER_OVERFLOW": return apiError("headers_too_large", {});
    case "HPE_CHUNK_EXTENSIONS_OVERFLOW": return apiError("body_too_large", {});
  }
  const reason = (err as ConnectionError & { reason?: unknown }).reason;
  return apiError("bad_request", { detail: typeof reason === "string" ? reason : "the request could not be parsed" });
}

function rawAnswer(e: ApiError): string {
  const body = JSON.stringify(e.body());
  const head = [`HTTP/1.1 ${e.status} ${STATUS_CODES[e.status] ?? ""}`, "content-type: application/json; charset=utf-8", `content-length: ${Buffer.byteLength(body)}`, "connection: close"];
  return `${head.join("\r\n")}\r\n\r\n${body}`;
}

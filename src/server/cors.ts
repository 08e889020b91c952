/**
 * CORS for browser clients (`--allowed-origins`, vLLM's name). A preflight is
 * answered before auth, for any path: 204 with the grant when its origin is
 * allowed, 403 otherwise. Every response to an allowed origin, errors and
 * streams included, carries Access-Control-Allow-Origin (the origin itself)
 * and Vary: Origin. The grant is set on the raw response at onRequest: a
 * streaming handler hijacks the reply and calls writeHead itself, which
 * merges headers set with setHeader but never sees fastify's reply headers.
 * No Allow-Credentials: keys travel in the Authorization header, never in
 * cookies, so a browser never sends a credential the page did not set.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { ServerResponse } from "node:http";
import { apiError } from "./errors.js";

/** The methods our routes answer. */
const ALLOW_METHODS = "GET, POST, OPTIONS";
/** Always granted, whether or not the preflight lists them: what every API call sends. */
const BASE_HEADERS = ["authorization", "content-type"];
/** Response headers a page may read beyond the safelisted ones: backoff on 429/503, and the id to quote in a report. */
const EXPOSE_HEADERS = "retry-after, x-request-id";
/** Seconds a browser may reuse a preflight (Chromium caps it at 7200); the allowed list only changes on restart. */
const MAX_AGE_S = 7200;
/** An HTTP header name (RFC 9110 token). */
const TOKEN = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;

/**
 * Installs the CORS hook. Call before any other onRequest hook (auth must not
 * see a preflight). `allowedOrigins`: origins such as https://app.example.com,
 * or "*" for any; empty: no cross-origin access.
 */
export function installCors(app: FastifyInstance, allowedOrigins: readonly string[]): void {
  const allowed = originMatcher(allowedOrigins);
  const varies = allowedOrigins.length > 0;
  app.addHook("onRequest", async (req, reply) => {
    const origin = req.headers.origin;
    const granted = origin !== undefined && allowed(origin);
    if (isPreflight(req)) {
      if (!granted) throw apiError("origin_not_allowed", { origin: origin ?? "" });
      return answerPreflight(req, reply, origin);
    }
    if (varies) reply.raw.setHeader("vary", "Origin");
    if (granted) grant(reply.raw, origin);
  });
}

/** A predicate over Origin header values; throws at start on an entry that is not an origin. */
export function originMatcher(entries: readonly string[]): (origin: string) => boolean {
  if (entries.includes("*")) return () => true;
  const origins = new Set(entries.map(normalizeOrigin));
  return (origin) => origins.has(origin.toLowerCase());
}

function normalizeOrigin(entry: string): string {
  const url = URL.canParse(entry) ? new URL(entry) : null;
  const isOrigin = url !== null && (url.protocol === "http:" || url.protocol === "https:") && url.pathname === "/" && !url.search && !url.hash;
  if (!isOrigin) throw new Error(`allowed origin '${entry}' is not an origin such as https://app.example.com (or '*')`);
  return url.origin;
}

function isPreflight(req: FastifyRequest): boolean {
  return req.method === "OPTIONS" && req.headers.origin !== undefined && req.headers["access-control-request-method"] !== undefined;
}

function answerPreflight(req: FastifyRequest, reply: FastifyReply, origin: string): FastifyReply {
  grant(reply.raw, origin);
  reply.raw.setHeader("vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers");
  reply.raw.setHeader("access-control-allow-methods", ALLOW_METHODS);
  reply.raw.setHeader("access-control-allow-headers", allowHeaders(req.headers["access-control-request-headers"]));
  reply.raw.setHeader("access-control-max-age", String(MAX_AGE_S));
  // Chrome's Private Network Access: an allowed public page may call this server on a private address.
  if (req.headers["access-control-request-private-network"] === "true") reply.raw.setHeader("access-control-allow-private-network", "true");
  return reply.code(204).send();
}

/** The base headers plus every well-formed one the preflight asks for: the origin is trusted, and SDKs send their own (x-stainless-*). */
function allowHeaders(requested: string | undefined): string {
  const names = (requested ?? "").split(",").map((h) => h.trim().toLowerCase()).filter((h) => TOKEN.test(h));
  return [...new Set([...BASE_HEADERS, ...names])].join(", ");
}

function grant(res: ServerResponse, origin: string): void {
  res.setHeader("access-control-allow-origin", origin);
  res.setHeader("access-control-expose-headers", EXPOSE_HEADERS);
}

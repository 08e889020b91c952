/**
 * DNS-rebinding defence. A page on evil.example can re-point its name at
 * 127.0.0.1 and then call this server as its own origin, past CORS; but its
 * requests still say `Host: evil.example`. So while auth is off (nothing else
 * stops such a page) only these Host names are answered: localhost, IP
 * literals (a rebinding needs a name; Vite and webpack-dev-server allow them
 * too) and `--allowed-hosts`. While auth is on, the page has no key, so Host
 * is checked only when `--allowed-hosts` is given. "*" allows any host.
 * A request without Host (HTTP/1.0) is not a browser's and passes.
 */
import type { FastifyInstance } from "fastify";
import { isIP } from "node:net";
import { apiError } from "./errors.js";

export interface HostCheckOptions {
  /** Host names answered besides localhost and IP literals, without port; "*" for any. */
  allowedHosts: readonly string[];
  /** Whether API keys are required now (Authenticator.required): it can turn on while serving. */
  authRequired: () => boolean;
}

/** Installs the Host check. Call before the auth hook, so that no other hook sees a refused request. */
export function installHostCheck(app: FastifyInstance, o: HostCheckOptions): void {
  const listed = new Set(o.allowedHosts.map(hostName));
  const anyHost = listed.has("*");
  app.addHook("onRequest", async (req) => {
    if (anyHost || (o.allowedHosts.length === 0 && o.authRequired())) return;
    const header = req.headers.host;
    if (header === undefined) return;
    const name = hostName(header);
    if (name === "localhost" || isIP(name) !== 0 || listed.has(name)) return;
    throw apiError("host_not_allowed", { host: header });
  });
}

/** The name in a Host header, lower-cased, without port, IPv6 brackets or a trailing dot. */
export function hostName(header: string): string {
  const h = header.trim().toLowerCase();
  if (h.startsWith("[")) {
    const end = h.indexOf("]");
    return end < 0 ? h : h.slice(1, end);
  }
  const name = h.replace(/:\d*$/, "");
  return name.endsWith(".") ? name.slice(0, -1) : name;
}

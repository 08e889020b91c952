/** A loopback imitation of the Hugging Face hub's file endpoints: tree listing, paths-info, and ranged resolve downloads. */
import http from "node:http";
import { createHash } from "node:crypto";

export interface FakeHub {
  url: string;
  /** "METHOD /path" of every request, in order. */
  requests: string[];
  close: () => void;
}

/** Serves `files` (name → bytes) as repo `repo` at commit `commit`. */
export function fakeHub(repo: string, commit: string, files: Map<string, Buffer>): Promise<FakeHub> {
  const entries = [...files].map(([name, data]) => ({ name, data, oid: createHash("sha256").update(data).digest("hex") }));
  const requests: string[] = [];
  const server = http.createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    const url = new URL(req.url!, "http://x");
    const json = (v: unknown): void => { res.setHeader("content-type", "application/json"); res.end(JSON.stringify(v)); };
    if (url.pathname === `/api/models/${repo}/tree/main`) return json(entries.map((f) => ({ type: "file", path: f.name, oid: f.oid, size: f.data.length })));
    if (url.pathname.startsWith(`/api/models/${repo}/paths-info/`)) {
      let body = "";
      req.on("data", (d: Buffer) => (body += d.toString()));
      req.on("end", () => {
        const { paths } = JSON.parse(body) as { paths: string[] };
        json(entries.filter((f) => paths.includes(f.name)).map((f) => ({ type: "file", path: f.name, oid: f.oid, size: f.data.length,
          lfs: { oid: f.oid, size: f.data.length }, lastCommit: { id: commit, title: "init", date: "2026-01-01T00:00:00Z" } })));
      });
      return;
    }
    const m = new RegExp(`^/${repo}/resolve/[^/]+/(.+)$`).exec(url.pathname);
    const f = m && entries.find((x) => x.name === decodeURIComponent(m[1]!));
    if (!f) {
      res.statusCode = 404;
      res.setHeader("x-error-code", "EntryNotFound");
      return res.end();
    }
    res.setHeader("etag", `"${f.oid}"`);
    const range = /bytes=(\d+)-(\d*)/.exec(req.headers.range ?? "");
    if (!range) return res.end(f.data);
    const start = Number(range[1]), end = range[2] ? Number(range[2]) : f.data.length - 1;
    res.statusCode = 206;
    res.setHeader("content-range", `bytes ${start}-${end}/${f.data.length}`);
    res.end(f.data.subarray(start, end + 1));
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as { port: number }).port;
    resolve({ url: `http://127.0.0.1:${port}`, requests, close: () => server.close() });
  }));
}

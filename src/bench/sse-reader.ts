/** Client side of server-sent events: the JSON payload of each `data:` line, up to `data: [DONE]`. */
export async function* readSseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<Record<string, unknown>> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (line === "data: [DONE]") return;
      if (line.startsWith("data: ")) yield JSON.parse(line.slice(6)) as Record<string, unknown>;
    }
  }
}

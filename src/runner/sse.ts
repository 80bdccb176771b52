// Server-sent events read as the WHATWG spec reads them (html.spec.whatwg.org, "Interpreting an
// event stream"): lines end in CRLF, LF or a lone CR; a line starting with ':' is a comment; a
// line without a colon is a field with an empty value; one space after the colon is dropped; the
// `data:` lines of an event are joined with LF, and an empty line ends the event. An OpenAI-
// compatible server behind a proxy may use any of these, and each is a valid stream. Only `data`
// matters to regen: `event`, `id` and `retry` are read and let go. Pure.

const COLON = 0x3a;
const SPACE = 0x20;
const BOM = '\uFEFF';
const DATA_FIELD = 'data: ';

export class EventStreamParser {
  /** What is not yet read: the line not yet ended, or, on the LF path, the event not yet ended. */
  private tail = '';
  /** The data of the event being read, or null before its first `data` field. */
  private data: string | null = null;
  /** The last chunk ended in CR: an LF that starts the next one ends the same line. */
  private afterCR = false;
  private started = false;

  /** Characters held until their line or event ends. */
  get heldChars(): number {
    return this.tail.length + (this.data?.length ?? 0);
  }

  /** Reads a decoded chunk; returns the data of each event it completed, in order. */
  push(chunk: string): string[] {
    const events: string[] = [];
    let text = this.tail + chunk;
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.startsWith(BOM)) text = text.slice(1);
    }
    let start = 0;
    if (this.afterCR && text.length > 0) {
      this.afterCR = false;
      if (text.charCodeAt(0) === 0x0a) start = 1;
    }
    if (this.data === null && text.indexOf('\r', start) < 0) {
      // LF alone, SGLang's framing: whole events are cut at their empty line, a `data: …` line
      // alone taken as it is, at a few thousand events a second per stream.
      for (let end = text.indexOf('\n\n', start); end >= 0; end = text.indexOf('\n\n', start)) {
        const event = text.slice(start, end);
        start = end + 2;
        if (event.startsWith(DATA_FIELD) && !event.includes('\n')) events.push(event.slice(DATA_FIELD.length));
        else {
          for (const line of event.split('\n')) this.line(line, events);
          this.line('', events);
        }
      }
      this.tail = text.slice(start);
      return events;
    }
    // The tail may hold whole lines of an event not yet ended: read from its start.
    let pos = start;
    let cr = text.indexOf('\r', pos);
    for (;;) {
      const lf = text.indexOf('\n', pos);
      if (cr >= 0 && cr < pos) cr = text.indexOf('\r', pos);
      const end = lf < 0 ? cr : cr < 0 ? lf : Math.min(lf, cr);
      if (end < 0) break;
      this.line(text.slice(start, end), events);
      pos = end + 1;
      if (end === cr) {
        if (end + 1 === text.length) this.afterCR = true;
        else if (text.charCodeAt(end + 1) === 0x0a) pos = end + 2;
      }
      start = pos;
    }
    this.tail = text.slice(start);
    return events;
  }

  private line(line: string, events: string[]): void {
    if (line === '') {
      if (this.data !== null) events.push(this.data);
      this.data = null;
      return;
    }
    if (line.charCodeAt(0) === COLON) return;
    const colon = line.indexOf(':');
    if ((colon < 0 ? line : line.slice(0, colon)) !== 'data') return;
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.charCodeAt(0) === SPACE) value = value.slice(1);
    this.data = this.data === null ? value : `${this.data}\n${value}`;
  }
}

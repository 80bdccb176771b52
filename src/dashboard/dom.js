// @ts-check
// Every node is built here with textContent and properties, never from HTML strings, so nothing a
// run, a sample or an endpoint contains can turn into markup.

// Arrays nest to any depth (append flattens them); a JSDoc type cannot say so of itself.
/** @typedef {Node | string | number | null | undefined | false | readonly unknown[]} Child */

/**
 * h('td', {className: 'num', onclick}, 'text', otherNode, null)
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, unknown> | null} props
 * @param {...Child} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value == null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), /** @type {EventListener} */ (value));
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key in el) /** @type {Record<string, unknown>} */ (/** @type {unknown} */ (el))[key] = value;
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

/**
 * @param {HTMLElement} el
 * @param {readonly unknown[]} children
 */
function append(el, children) {
  for (const child of children) {
    if (child == null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/**
 * Replaces an element's children.
 * @param {HTMLElement} el
 * @param {...Child} children
 */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/**
 * A link inside the dashboard; parts are encoded so an id can never leave its place in the hash.
 * @param {...string} parts
 */
export function route(...parts) {
  return '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
}

/**
 * @param {number | null | undefined} fraction
 * @param {string} [status]
 */
export function progressBar(fraction, status) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  const fillEl = h('div', { className: `fill s-${status ?? 'none'}` });
  fillEl.style.width = `${pct.toFixed(2)}%`;
  return h('div', { className: 'bar', role: 'progressbar', 'aria-valuenow': pct.toFixed(1), 'aria-valuemin': 0, 'aria-valuemax': 100 }, fillEl);
}

/** @param {string} status */
export function badge(status) {
  return h('span', { className: `badge s-${status}` }, status.replaceAll('_', ' '));
}

/**
 * A table from column definitions: [{label, cell: (row) => node|string, className, title}], `title`
 * the header's tooltip.
 * @template T
 * @param {{ label: string, className?: string, title?: string, cell: (row: T) => Child }[]} columns
 * @param {T[]} rows
 * @param {string} empty
 */
export function table(columns, rows, empty) {
  if (!rows.length) return h('p', { className: 'muted' }, empty);
  return h(
    'table',
    null,
    h(
      'thead',
      null,
      h(
        'tr',
        null,
        columns.map((c) => h('th', { className: c.className, title: c.title }, c.label)),
      ),
    ),
    h(
      'tbody',
      null,
      rows.map((r) =>
        h(
          'tr',
          null,
          columns.map((c) => h('td', { className: c.className }, c.cell(r))),
        ),
      ),
    ),
  );
}

/**
 * SGLang's radix cache (mem_cache/radix_cache.py), as the simulator keeps it per DP rank: a tree of
 * the token sequences the rank has computed, each edge a run of tokens. A request matches the
 * longest cached prefix of its prompt and prefills only the rest; while it runs its matched path
 * is locked, and when it finishes its prompt and generated tokens are in the tree. The tree lives
 * in the KV pool: past `capacity()` tokens, unlocked leaves go, least recently used first.
 */
export interface Node {
  tokens: number[];
  parent: Node | null;
  children: Map<number, Node>;
  /** Requests running on this node's path. */
  locks: number;
  lastAccess: number;
}

/** Where a match ended: the node to lock while the request runs, and how many tokens matched. */
export interface PrefixMatch {
  readonly node: Node;
  readonly length: number;
}

const newNode = (tokens: number[], parent: Node | null, at: number): Node => ({ tokens, parent, children: new Map(), locks: 0, lastAccess: at });

export class PrefixCache {
  readonly #root = newNode([], null, 0);
  #size = 0;
  // A logical clock: order is all LRU needs, and it makes eviction deterministic.
  #tick = 0;

  constructor(private readonly capacity: () => number) {}

  /** Tokens held in the tree. */
  get size(): number {
    return this.#size;
  }

  /** The longest cached prefix of `tokens`; touches its path. */
  match(tokens: readonly number[]): PrefixMatch {
    const at = ++this.#tick;
    let node = this.#root;
    let length = 0;
    for (;;) {
      node.lastAccess = at;
      if (length === tokens.length) return { node, length };
      const child = node.children.get(tokens[length]);
      if (!child) return { node, length };
      const common = commonLength(child.tokens, tokens, length);
      length += common;
      if (common < child.tokens.length) {
        child.lastAccess = at;
        return { node: child, length };
      }
      node = child;
    }
  }

  /** Puts `tokens` in the tree (splitting an edge where they leave it), then evicts to capacity; returns the node where they end. */
  insert(tokens: readonly number[]): Node {
    const at = ++this.#tick;
    let node = this.#root;
    let i = 0;
    while (i < tokens.length) {
      node.lastAccess = at;
      const child = node.children.get(tokens[i]);
      if (!child) {
        const leaf = newNode(tokens.slice(i), node, at);
        node.children.set(tokens[i], leaf);
        this.#size += leaf.tokens.length;
        node = leaf;
        break;
      }
      const common = commonLength(child.tokens, tokens, i);
      if (common < child.tokens.length) this.#split(child, common);
      node = node.children.get(tokens[i])!;
      i += common;
    }
    node.lastAccess = at;
    // The new path is locked while room is made, so that it is not the first to go.
    this.lock(node);
    this.evict();
    this.unlock(node);
    return node;
  }

  lock(node: Node): void {
    for (let n: Node | null = node; n; n = n.parent) n.locks++;
  }

  unlock(node: Node): void {
    for (let n: Node | null = node; n; n = n.parent) n.locks--;
  }

  /** Drops unlocked leaves, least recently used first, until the tree fits its capacity. */
  evict(): void {
    const capacity = Math.max(0, this.capacity());
    if (this.#size <= capacity) return;
    const heap = new LeafHeap();
    const walk = (node: Node): void => {
      if (node.children.size === 0 && node !== this.#root && node.locks === 0) heap.push(node);
      for (const child of node.children.values()) walk(child);
    };
    walk(this.#root);
    while (this.#size > capacity) {
      const leaf = heap.pop();
      if (!leaf) return;
      const parent = leaf.parent!;
      parent.children.delete(leaf.tokens[0]);
      this.#size -= leaf.tokens.length;
      if (parent !== this.#root && parent.children.size === 0 && parent.locks === 0) heap.push(parent);
    }
  }

  // A new node takes the edge's first `at` tokens above the child, which keeps the rest: a lock held on the child stays where it was.
  #split(child: Node, at: number): void {
    const parent = child.parent!;
    const top = newNode(child.tokens.slice(0, at), parent, child.lastAccess);
    top.locks = child.locks;
    child.tokens = child.tokens.slice(at);
    child.parent = top;
    top.children.set(child.tokens[0], child);
    parent.children.set(top.tokens[0], top);
  }
}

function commonLength(edge: readonly number[], tokens: readonly number[], from: number): number {
  let n = 0;
  while (n < edge.length && from + n < tokens.length && edge[n] === tokens[from + n]) n++;
  return n;
}

/** A min-heap of leaves by last access. */
class LeafHeap {
  readonly #items: Node[] = [];

  push(node: Node): void {
    const a = this.#items;
    a.push(node);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (a[p].lastAccess <= a[i].lastAccess) break;
      [a[p], a[i]] = [a[i], a[p]];
      i = p;
    }
  }

  pop(): Node | undefined {
    const a = this.#items;
    if (a.length === 0) return undefined;
    const top = a[0];
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && a[l].lastAccess < a[m].lastAccess) m = l;
        if (r < a.length && a[r].lastAccess < a[m].lastAccess) m = r;
        if (m === i) break;
        [a[m], a[i]] = [a[i], a[m]];
        i = m;
      }
    }
    return top;
  }
}

// Parquet schema elements as hyparquet-writer takes them: the standard three-level LIST for lists,
// as Arrow, DuckDB and `datasets` read them.

export type Element = { name: string; type?: string; converted_type?: string; repetition_type?: string; num_children?: number };

export const str = (name: string, repetition_type = 'OPTIONAL'): Element => ({ name, type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type });
export const int = (name: string, repetition_type = 'OPTIONAL'): Element => ({ name, type: 'INT32', repetition_type });
export const list = (name: string, element: Element[]): Element[] => [
  { name, repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  ...element,
];

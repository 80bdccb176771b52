import type { App } from '../../http/app.js';

export const OPENAPI_INFO = {
  openapi: '3.1.0',
  info: {
    title: 'regen',
    version: '0.1.0',
    description:
      'Control plane for large LLM completion-regeneration runs across a pool of SGLang servers. ' +
      'Errors are application/problem+json; lists are cursor-paginated with `limit` and `after`.',
    license: { name: 'Proprietary', identifier: 'LicenseRef-regen-proprietary' },
  },
  servers: [{ url: 'http://127.0.0.1:8080', description: '`regen serve` on its default address and port' }],
  tags: [
    { name: 'runs', description: 'Regeneration runs: create, follow, pause, resume, cancel, retry; their samples, shards and quality' },
    { name: 'files', description: 'Uploaded JSONL inputs (and batch output files), as OpenAI Files' },
    { name: 'batches', description: "OpenAI's Batch API over runs" },
    { name: 'endpoints', description: 'The SGLang servers regen dispatches to' },
    { name: 'service', description: "Liveness, readiness, Prometheus metrics and the fleet's history" },
  ],
};

/** The OpenAPI document the routes describe; openapi.yaml is this, written by `npm run openapi`. */
export function openApiDocument(app: App) {
  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', { type: 'http', scheme: 'bearer' });
  return app.getOpenAPI31Document({ ...OPENAPI_INFO, security: [{ bearer: [] }] });
}

export function registerOpenApi(app: App) {
  app.get('/openapi.json', (c) => c.json(openApiDocument(app)));
  app.get('/docs', (c) => c.html(DOCS_PAGE));
}

// A self-contained reference page: it reads /openapi.json and lists every operation with its schemas.
const DOCS_PAGE = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>regen API reference</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>body{font:14px/1.5 system-ui,sans-serif;margin:0;color:#1d2330}main{max-width:1000px;margin:0 auto;padding:24px}
h1{font-size:22px}h2{margin-top:32px;border-bottom:1px solid #ddd;text-transform:capitalize}.op{border:1px solid #e2e5ea;border-radius:6px;margin:12px 0;padding:10px 14px}
.m{display:inline-block;min-width:56px;font-weight:700;text-transform:uppercase}.get{color:#0b7a3e}.post{color:#1f5fbf}.patch{color:#a35c00}.delete{color:#b3261e}
code,pre{font-family:ui-monospace,monospace;font-size:12px}pre{background:#f6f7f9;padding:8px;overflow:auto;max-height:320px}details{margin-top:6px}</style></head>
<body><main><h1>regen API reference</h1><p id="desc"></p><p><a href="/openapi.json">openapi.json</a></p><div id="ops">Loading…</div></main>
<script>
fetch('/openapi.json').then(r=>r.json()).then(doc=>{
  document.getElementById('desc').textContent=doc.info.description;
  const byTag={};
  for(const [path,item] of Object.entries(doc.paths)) for(const [method,op] of Object.entries(item)){
    const tag=(op.tags||['other'])[0];(byTag[tag]=byTag[tag]||[]).push({path,method,op});}
  const el=document.getElementById('ops');el.textContent='';
  const esc=s=>String(s).replace(/[&<>]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;'}[c]));
  for(const [tag,ops] of Object.entries(byTag)){
    el.insertAdjacentHTML('beforeend','<h2>'+esc(tag)+'</h2>');
    for(const {path,method,op} of ops){
      const body=op.requestBody?'<details><summary>Request body</summary><pre>'+esc(JSON.stringify(op.requestBody.content,null,2))+'</pre></details>':'';
      const params=op.parameters&&op.parameters.length?'<details><summary>Parameters</summary><pre>'+esc(JSON.stringify(op.parameters,null,2))+'</pre></details>':'';
      const res='<details><summary>Responses</summary><pre>'+esc(JSON.stringify(op.responses,null,2))+'</pre></details>';
      el.insertAdjacentHTML('beforeend','<div class="op"><span class="m '+method+'">'+method+'</span> <code>'+esc(path)+'</code><div>'+esc(op.summary||'')+'</div>'+(op.description?'<div>'+esc(op.description)+'</div>':'')+params+body+res+'</div>');
    }
  }
  const schemas=doc.components&&doc.components.schemas||{};
  el.insertAdjacentHTML('beforeend','<h2>schemas</h2>'+Object.entries(schemas).map(([n,s])=>'<details><summary><code>'+esc(n)+'</code></summary><pre>'+esc(JSON.stringify(s,null,2))+'</pre></details>').join(''));
});
</script></body></html>`;

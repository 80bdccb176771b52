// @ts-check
// Hash routing: #/ runs, #/runs/<id> a run, #/runs/<id>/samples?flag=… a filtered list,
// #/runs/<id>/samples/<custom_id> one sample.
import { initAuth } from './api.js';
import { fill, h } from './dom.js';
import { runView } from './run.js';
import { runsView } from './runs.js';
import { sampleView, samplesView } from './samples.js';

const root = /** @type {HTMLElement} */ (document.getElementById('view'));
let unmount = () => {};

/** @param {string} part */
const decode = (part) => {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
};

function show() {
  unmount();
  document.title = 'regen';
  const [path, search] = location.hash.replace(/^#\/?/, '').split('?');
  const parts = path.split('/').filter(Boolean).map(decode);
  const query = new URLSearchParams(search ?? '');
  if (parts.length === 0) unmount = runsView(root);
  else if (parts[0] === 'runs' && parts.length === 2) unmount = runView(root, parts[1]);
  else if (parts[0] === 'runs' && parts.length === 3 && parts[2] === 'samples') unmount = samplesView(root, parts[1], query);
  else if (parts[0] === 'runs' && parts.length === 4 && parts[2] === 'samples') unmount = sampleView(root, parts[1], parts[3]);
  else {
    fill(root, h('p', null, 'Nothing here. ', h('a', { href: '#/' }, 'Back to the runs.')));
    unmount = () => {};
  }
  window.scrollTo(0, 0);
}

initAuth();
window.addEventListener('hashchange', show);
show();

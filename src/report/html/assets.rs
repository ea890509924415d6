//! The page's style sheet and script, embedded in every page (nothing is fetched).

pub(super) const STYLE: &str = "\
body{font:14px/1.45 system-ui,sans-serif;color:#1d1d1f;margin:0 auto;max-width:1500px;padding:0 18px 40px}\
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 0;z-index:1}\
h1{font-size:20px;margin:4px 0}h2{font-size:16px;margin:22px 0 6px}\
nav a{margin-right:14px}.sub,.note{color:#666}ol.runs{margin:2px 0 6px}\
code{font:12.5px ui-monospace,monospace}\
.status{padding:0 5px;border-radius:3px;background:#eee}.status.succeeded{background:#d9f2df}\
.status.failed,.status.interrupted{background:#f8d7d4}\
.warnings{background:#fff4e0;border-left:4px solid #e0a030;padding:8px 8px 8px 28px}\
table{border-collapse:collapse;margin:6px 0}\
th,td{border-bottom:1px solid #e4e4e4;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}\
.scroll{max-height:65vh;overflow:auto;display:inline-block;max-width:100%}\
thead th{background:#f6f6f6;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.better{color:#0a7a2a}.worse{color:#b3261e}tr.differs{background:#fff8db}\
.layer{color:#777;font-size:12px}td.none{color:#999}\
th[data-first]{cursor:pointer;user-select:none}\
th[data-dir=asc]::after{content:' \\25B2'}th[data-dir=desc]::after{content:' \\25BC'}\
.plots{display:flex;flex-wrap:wrap;gap:14px}.plots figure{margin:0}.plots svg{max-width:100%;height:auto}\
.bar{display:flex;width:260px;height:12px;background:#eee}.bar span{height:100%}\
.bar .dit{background:#1f77b4}.bar .vae{background:#ff7f0e}.bar .layout{background:#2ca02c}.bar .other{background:#aaa}\
.grid td.text{max-width:360px}.grid td.text p{margin:0 0 6px}.grid p.other{color:#8a4b00}\
.ctl{display:flex;gap:6px;align-items:center}.ctl button{width:34px}.ctl input{flex:1;min-width:80px}\
video{display:block;width:300px;max-width:100%;aspect-ratio:16/9;background:#222;cursor:pointer}\
.filter input{width:320px;padding:4px}\
";

/// The page's script: sortable tables, lazy videos, a control per row that plays, pauses and
/// seeks its videos together, the filter, and a self-test. The self-test runs only when the
/// page is opened with `#selftest`: it sorts the first sortable table by its first column (both
/// ways), plays, pauses and seeks the first row of videos through its control, and writes what
/// the rows and videos did into `<pre id="selftest">` (for tests in a headless browser).
/// `#filter=TEXT` opens the page filtered, `#only=SECTION` with that section alone
/// (`#only=videos`).
pub(super) const SCRIPT: &str = r#"
(() => {
"use strict";
const all = (sel, root) => Array.from((root || document).querySelectorAll(sel));
const params = new URLSearchParams(location.hash.slice(1));
for (const table of all("table.sortable")) {
  const body = table.tBodies[0], heads = all("thead th", table);
  heads.forEach((th, col) => {
    if (!th.dataset.first) return;
    th.addEventListener("click", () => {
      const dir = th.dataset.dir ? (th.dataset.dir === "asc" ? "desc" : "asc") : th.dataset.first;
      heads.forEach(h => delete h.dataset.dir);
      th.dataset.dir = dir;
      const key = tr => { const v = tr.cells[col].dataset.v; return v ? parseFloat(v) : null; };
      const rows = Array.from(body.rows).sort((x, y) => {
        const a = key(x), b = key(y);
        if (a === null || b === null) return (a === null) - (b === null);
        return a === b ? 0 : (dir === "asc") === (a < b) ? -1 : 1;
      });
      body.append(...rows);
    });
  });
}
if (params.has("only")) for (const s of all("section")) s.hidden = s.id !== params.get("only");
const rows = all("tr.prompt");
const load = tr => {
  for (const v of all("video[data-src]", tr)) {
    if (!v.getAttribute("src")) { v.preload = "metadata"; v.src = v.dataset.src; }
  }
};
if ("IntersectionObserver" in window) {
  const seen = new IntersectionObserver(entries => {
    for (const e of entries) if (e.isIntersecting) { load(e.target); seen.unobserve(e.target); }
  }, { rootMargin: "300px 0px" });
  rows.forEach(tr => seen.observe(tr));
} else rows.forEach(load);
for (const tr of rows) {
  const videos = all("video[data-src]", tr), lead = videos[0];
  const button = tr.querySelector("button.play"), seek = tr.querySelector("input.seek");
  if (!lead) { button.disabled = seek.disabled = true; continue; }
  const show = () => { button.textContent = lead.paused ? "\u25B6" : "\u275A\u275A"; };
  lead.addEventListener("play", show);
  lead.addEventListener("pause", show);
  button.addEventListener("click", () => {
    load(tr);
    if (!lead.paused) { videos.forEach(v => v.pause()); return; }
    const t = lead.ended ? 0 : lead.currentTime;
    videos.forEach(v => { v.currentTime = t; v.play().catch(() => {}); });
  });
  videos.forEach(v => v.addEventListener("click", () => button.click()));
  lead.addEventListener("timeupdate", () => {
    if (lead.duration) seek.value = Math.round(1000 * lead.currentTime / lead.duration);
    if (lead.paused) return;
    for (const v of videos) {
      if (v !== lead && !v.ended && Math.abs(v.currentTime - lead.currentTime) > 0.2) v.currentTime = lead.currentTime;
    }
  });
  lead.addEventListener("ended", () => videos.forEach(v => v.pause()));
  seek.addEventListener("input", () => {
    load(tr);
    const go = () => {
      const t = seek.value / 1000 * lead.duration;
      videos.forEach(v => { v.currentTime = Math.min(t, v.duration || t); });
    };
    if (lead.readyState >= 1) go(); else lead.addEventListener("loadedmetadata", go, { once: true });
  });
}
const filter = document.getElementById("filter"), shown = document.getElementById("shown");
if (filter) {
  const texts = rows.map(tr => all("td.text p", tr).map(p => p.textContent).join("\n").toLowerCase());
  const apply = () => {
    const q = filter.value.trim().toLowerCase();
    let n = 0;
    rows.forEach((tr, i) => { tr.hidden = q !== "" && !texts[i].includes(q); if (!tr.hidden) n++; });
    shown.textContent = n + " of " + rows.length + " prompts";
  };
  filter.addEventListener("input", apply);
  if (params.has("filter")) { filter.value = params.get("filter"); apply(); }
}
if (params.has("selftest")) {
  const out = document.createElement("pre");
  out.id = "selftest";
  out.hidden = true;
  document.body.append(out);
  const result = { rows: rows.length };
  const table = document.querySelector("table.sortable");
  if (table) {
    const order = () => Array.from(table.tBodies[0].rows, r => Number(r.cells[0].dataset.v));
    const head = table.tHead.rows[0].cells[0];
    result.sorted = [order()];
    head.click();
    result.sorted.push(order());
    head.click();
    result.sorted.push(order());
  }
  const tr = rows.find(r => r.querySelector("video[data-src]"));
  const state = () => all("video[data-src]", tr).map(v => ({
    src: v.getAttribute("src"), paused: v.paused, time: v.currentTime,
    duration: v.duration || null, ready: v.readyState, error: v.error && v.error.code }));
  const wait = ms => new Promise(r => setTimeout(r, ms));
  (async () => {
    if (tr) {
      const button = tr.querySelector("button.play"), seek = tr.querySelector("input.seek");
      button.click();
      await wait(1500);
      result.playing = state();
      button.click();
      await wait(300);
      result.paused = state();
      seek.value = "500";
      seek.dispatchEvent(new Event("input"));
      await wait(300);
      result.seeked = state();
    }
    out.textContent = JSON.stringify(result);
  })();
}
})();
"#;

"use strict";
// osmosis report: the row table (sort, filter, pages) and the trajectory viewer.
// Every piece of run content is put on screen as text (textContent), never parsed as markup.
(function () {
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const RUNS = D.runs.length;
  const COMPARE = RUNS > 1;
  const PAGE = 100;
  const state = { text: "", failures: false, never: false, category: "", flip: "", sort: null, page: 0 };
  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const fmt = (v, d = 3) => (v === null || v === undefined ? "\u2013" : Number(v).toFixed(d));
  const secs = (v) => (v === null || v === undefined ? "\u2013" : v < 100 ? v.toFixed(2) + " s" : Math.round(v).toLocaleString() + " s");

  // --- rows --------------------------------------------------------------------------------
  const rows = D.rows.map((row) => {
    const cats = new Set();
    let failed = false, solved = false, graded = false;
    row.r.forEach((list, k) => list.forEach((i) => {
      const ro = D.rollouts[k][i];
      if (ro.c) cats.add(ro.c);
      if (ro.st === 1) failed = true;
      if (ro.p === 1) solved = true;
      if (ro.p !== undefined) graded = true;
    }));
    const errors = [...cats].sort();
    const hay = [String(row.i), row.p, row.l, ...errors,
      ...row.r.flatMap((list, k) => list.map((i) => D.rollouts[k][i].m || ""))].join("\n").toLowerCase();
    const delta = COMPARE && row.m[0] !== null ? row.m.slice(1).map((m) => (m === null ? null : m - row.m[0])) : [];
    return { row, errors, failed, never: graded && !solved, hay, delta };
  });
  const select = $("filter-category");
  for (const c of D.categories) select.append(el("option", { value: c, text: c }));

  function visible() {
    const text = state.text.trim().toLowerCase();
    let out = rows.filter((x) =>
      (!text || x.hay.includes(text)) &&
      (!state.failures || x.failed) &&
      (!state.never || x.never) &&
      (!state.category || x.errors.includes(state.category)) &&
      (!state.flip || (state.flip === "any" ? x.row.fl.some((f) => f) : x.row.fl.includes(state.flip))));
    if (state.sort) {
      const { key, dir } = state.sort;
      const value = (x) => key(x);
      out = out.slice().sort((a, b) => {
        const va = value(a), vb = value(b);
        if (va === vb) return a.row.i - b.row.i;
        if (va === null || va === undefined) return 1;
        if (vb === null || vb === undefined) return -1;
        return (va < vb ? -1 : 1) * dir;
      });
    }
    return out;
  }

  const columns = [{ title: "row", key: (x) => x.row.i, cls: "num idx" }, { title: "prompt" }, { title: "label" }];
  for (let k = 0; k < RUNS; k++) {
    const name = COMPARE ? (k + 1) + ". " : "";
    columns.push({ title: name + "samples", run: k, kind: "chips" });
    columns.push({ title: name + "mean", run: k, kind: "mean", key: (x) => x.row.m[k], cls: "num" });
    columns.push({ title: name + "pass", run: k, kind: "pass", key: (x) => (x.row.pc[k][1] ? x.row.pc[k][0] / x.row.pc[k][1] : null), cls: "num" });
  }
  if (COMPARE) for (let k = 1; k < RUNS; k++) columns.push({ title: "\u0394 " + (k + 1) + " vs 1", kind: "delta", run: k, key: (x) => x.delta[k - 1], cls: "num" });
  columns.push({ title: "errors", key: (x) => x.errors.length || null });

  function head() {
    const tr = el("tr");
    columns.forEach((col) => {
      const th = el("th", { class: col.key ? "sortable" : null, text: col.title });
      if (col.key) th.addEventListener("click", () => {
        const same = state.sort && state.sort.col === col;
        state.sort = { col, key: col.key, dir: same ? -state.sort.dir : (col.kind ? -1 : 1) };
        state.page = 0;
        draw();
      });
      if (state.sort && state.sort.col === col) th.classList.add(state.sort.dir > 0 ? "sorted-asc" : "sorted-desc");
      tr.append(th);
    });
    const thead = $("row-table").tHead;
    thead.replaceChildren(tr);
  }

  function chipClass(ro) {
    if (ro.st === 2) return "cancelled";
    if (ro.st === 1) return "error";
    if (ro.p === 1) return "pass";
    if (ro.p === 0) return "nopass";
    return "ungraded";
  }
  function chipTitle(ro) {
    const bits = ["sample " + ro.s];
    if (ro.st === 1) bits.push(ro.c + " (" + ro.g + ")");
    else if (ro.st === 2) bits.push("cancelled");
    else bits.push("reward " + (ro.rw === undefined ? "none" : fmt(ro.rw)));
    if (ro.a) bits.push(ro.a + " attempts");
    return bits.join(" \u00b7 ");
  }

  function cell(col, x) {
    const row = x.row;
    if (col.title === "row") return el("td", { class: col.cls, text: row.i });
    if (col.title === "prompt") return el("td", { class: "prompt" }, el("div", { text: row.p, title: row.p }));
    if (col.title === "label") return el("td", { class: "label", text: row.l, title: row.l });
    if (col.title === "errors") return el("td", {}, x.errors.map((c) => el("span", { class: "tag cat", text: c })));
    const k = col.run;
    if (col.kind === "chips") {
      return el("td", {}, el("div", { class: "chips" }, row.r[k].map((i) => {
        const ro = D.rollouts[k][i];
        return el("button", { type: "button", class: "chip " + chipClass(ro), title: chipTitle(ro), "data-run": k, "data-rollout": i,
          onclick: () => openViewer(k, i, rowOrder()) });
      })));
    }
    if (col.kind === "mean") return el("td", { class: "num", text: fmt(row.m[k]) });
    if (col.kind === "pass") return el("td", { class: "num", text: row.pc[k][1] ? row.pc[k][0] + "/" + row.pc[k][1] : "\u2013" });
    if (col.kind === "delta") {
      const d = x.delta[k - 1], flip = row.fl[k - 1];
      const mark = flip === "down" ? " \u2193 fail" : flip === "up" ? " \u2191 pass" : "";
      return el("td", { class: "num" + (flip ? " flip-" + flip : ""), "data-flip": flip || null,
        text: (d === null || d === undefined ? "\u2013" : (d > 0 ? "+" : "") + d.toFixed(3)) + mark });
    }
    return el("td");
  }

  let current = [];
  function rowOrder() {
    return current.flatMap((x) => x.row.r.flatMap((list, k) => list.map((i) => [k, i])));
  }

  function draw() {
    head();
    current = visible();
    const pages = Math.max(1, Math.ceil(current.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const slice = current.slice(state.page * PAGE, (state.page + 1) * PAGE);
    const body = $("row-table").tBodies[0];
    body.replaceChildren(...slice.map((x) => el("tr", { "data-row": x.row.i }, columns.map((col) => cell(col, x)))));
    $("row-count").textContent = "showing " + current.length.toLocaleString() + " of " + rows.length.toLocaleString();
    $("page-info").textContent = "page " + (state.page + 1) + " of " + pages;
    $("page-prev").disabled = state.page === 0;
    $("page-next").disabled = state.page >= pages - 1;
  }

  let typing = null;
  $("filter-text").addEventListener("input", (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.text = e.target.value; state.page = 0; draw(); }, 120);
  });
  $("filter-failures").addEventListener("change", (e) => { state.failures = e.target.checked; state.page = 0; draw(); });
  $("filter-never").addEventListener("change", (e) => { state.never = e.target.checked; state.page = 0; draw(); });
  select.addEventListener("change", (e) => { state.category = e.target.value; state.page = 0; draw(); });
  if ($("filter-flip")) $("filter-flip").addEventListener("change", (e) => { state.flip = e.target.value; state.page = 0; draw(); });
  $("page-prev").addEventListener("click", () => { state.page--; draw(); });
  $("page-next").addEventListener("click", () => { state.page++; draw(); });

  // --- trajectories ------------------------------------------------------------------------
  const chunks = new Map();
  function chunk(run, c) {
    const key = run + "-" + c;
    if (!chunks.has(key)) {
      const node = document.getElementById("t-" + key);
      const text = node ? node.textContent.trim() : "";
      const bytes = Uint8Array.from(atob(text), (ch) => ch.charCodeAt(0));
      const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
      chunks.set(key, new Response(stream).text().then(JSON.parse));
    }
    return chunks.get(key);
  }
  async function trajectory(run, i) {
    const place = D.places[run][String(i)];
    if (!place) return null;
    const list = await chunk(run, place[0]);
    return list[place[1]];
  }

  const viewer = $("viewer");
  let order = [], position = -1;

  function section(title, ...children) {
    return el("div", { class: "v-sec" }, el("h3", { text: title }), ...children);
  }
  function kv(pairs) {
    return el("dl", { class: "kv" }, pairs.filter((p) => p[1] !== null && p[1] !== undefined && p[1] !== "")
      .flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));
  }
  function pretty(value) {
    if (typeof value === "string") {
      try { return JSON.stringify(JSON.parse(value), null, 2); } catch (e) { return value; }
    }
    return JSON.stringify(value, null, 2);
  }
  function textOf(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map((p) => (typeof p === "string" ? p : p && typeof p.text === "string" ? p.text : "")).join("");
    return "";
  }

  function renderMessage(m, names) {
    const role = String(m.role || m.type || "item");
    const head = el("div", { class: "role" }, el("span", { text: role }));
    const box = el("div", { class: "msg " + role.toLowerCase() }, head);
    if (m.role === "tool" && m.tool_call_id) head.append(el("span", { class: "muted", text: "result of " + (names[m.tool_call_id] || "call") + " \u00b7 " + m.tool_call_id }));
    if (m.name && m.role !== "tool") head.append(el("span", { class: "muted", text: m.name }));
    const content = m.content;
    const blocks = [];
    if (typeof content === "string" || content === null || content === undefined) {
      box.append(el("div", { class: "text", text: content || "" }));
    } else if (Array.isArray(content)) {
      for (const part of content) {
        if (typeof part === "string" || (part && typeof part.text === "string" && Object.keys(part).length <= 2)) box.append(el("div", { class: "text", text: typeof part === "string" ? part : part.text }));
        else if (part && part.toolUse) blocks.push(el("div", { class: "call tool-call" }, el("div", { class: "fn", text: "\u2192 " + part.toolUse.name + " \u00b7 " + (part.toolUse.toolUseId || "") }), el("pre", { text: pretty(part.toolUse.input) })));
        else if (part && part.toolResult) blocks.push(el("div", { class: "call" }, el("div", { class: "fn", text: "\u2190 result \u00b7 " + (part.toolResult.toolUseId || "") + " " + (part.toolResult.status || "") }), el("pre", { text: textOf(part.toolResult.content) || pretty(part.toolResult.content) })));
        else if (part && (part.type === "image_url" || part.image)) box.append(el("div", { class: "text muted", text: "[image not shown]" }));
        else blocks.push(el("pre", { class: "json", text: pretty(part) }));
      }
    } else {
      blocks.push(el("pre", { class: "json", text: pretty(content) }));
    }
    for (const call of m.tool_calls || []) {
      const fn = call.function || {};
      names[call.id] = fn.name;
      blocks.push(el("div", { class: "call tool-call" }, el("div", { class: "fn", text: "\u2192 " + (fn.name || "?") + (call.id ? " \u00b7 " + call.id : "") }), el("pre", { class: "args", text: pretty(fn.arguments) })));
    }
    if (!m.role && !m.content) blocks.push(el("pre", { class: "json", text: pretty(m) }));
    box.append(...blocks);
    return box;
  }

  function timingBar(t) {
    const parts = ["queued", "workflow", "grader"].filter((k) => t && t[k]);
    const total = parts.reduce((s, k) => s + t[k], 0) || 1;
    return el("div", {}, el("div", { class: "timing-bar" }, parts.map((k) => el("span", { class: k, title: k + " " + secs(t[k]), style: "width:" + (100 * t[k] / total).toFixed(1) + "%" }))),
      el("div", { class: "muted", text: parts.map((k) => k + " " + secs(t[k])).join(" \u00b7 ") }));
  }

  async function openViewer(run, i, list) {
    if (list) { order = list; }
    position = order.findIndex(([k, j]) => k === run && j === i);
    document.querySelectorAll(".chip.current").forEach((c) => c.classList.remove("current"));
    const chip = document.querySelector('.chip[data-run="' + run + '"][data-rollout="' + i + '"]');
    if (chip) chip.classList.add("current");
    const ro = D.rollouts[run][i];
    viewer.hidden = false;
    viewer.dataset.run = run;
    viewer.dataset.rollout = i;
    const status = ro.st === 0 ? "success" : ro.st === 1 ? "failure" : "cancelled";
    $("viewer-title").replaceChildren(el("span", { text: (COMPARE ? (run + 1) + ". " + D.runs[run].name + " \u00b7 " : "") + "row " + ro.w + ", sample " + ro.s }),
      el("span", { class: "sub", text: status + (ro.rw !== undefined ? " \u00b7 reward " + fmt(ro.rw) : "") }));
    const body = $("viewer-body");
    const parts = [];
    if (ro.st === 1) {
      const where = /\(at ([^)]*)\)\s*$/.exec(ro.m || "");
      parts.push(section("error", el("div", { class: "error-box" },
        el("div", {}, el("b", { text: ro.c }), " in the " + (ro.g || "?") + " stage"),
        el("div", { text: where ? (ro.m || "").slice(0, where.index).trim() : ro.m || "" }),
        where ? el("div", { class: "where", text: "raised at " + where[1] }) : null)));
    }
    parts.push(section("rollout", kv([
      ["rollout id", ro.id], ["status", status], ["reward", ro.rw === undefined ? "none" : fmt(ro.rw, 4)],
      ["passed", ro.p === undefined ? "not graded" : ro.p ? "yes" : "no"], ["attempts", ro.a || 1],
      ["finished", ro.f !== undefined ? "+" + ro.f.toFixed(1) + " s after the first rollout" : null],
    ]), ro.t ? timingBar(ro.t) : null));
    if (ro.k) {
      parts.push(section("tokens (trace)", kv([["model calls", ro.k[0]], ["prompt tokens", ro.k[1].toLocaleString()], ["generated tokens", ro.k[2].toLocaleString()], ["trace complete", ro.k[3] ? "yes" : "no"],
        ["per call (prompt / generated)", ro.k[4].map((c) => c[0] + " / " + c[1]).join(", ")]])));
    }
    if (ro.x && Object.keys(ro.x).length) {
      parts.push(section("grader metrics", kv(Object.entries(ro.x).map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)]))));
    }
    const loading = el("div", { class: "muted", text: "unpacking\u2026" });
    parts.push(loading);
    body.replaceChildren(...parts);
    body.scrollTop = 0;
    let t = null;
    try { t = await trajectory(run, i); } catch (e) { loading.textContent = "could not unpack this trajectory: " + e; return; }
    if (viewer.dataset.run !== String(run) || viewer.dataset.rollout !== String(i)) return;
    if (!t) {
      loading.textContent = D.places[run][String(i)] ? "no sample" : ro.st === 1 && ro.m ? "this rollout left no sample" : "this trajectory is not in the file (see the note at the top)";
      return;
    }
    const names = {};
    const msgs = (t.messages || []);
    const sys = t.system_prompt;
    const content = [];
    if (sys) content.push(section("system prompt", el("div", { class: "msg system" }, el("div", { class: "text", text: sys }))));
    content.push(section("messages (" + msgs.length + (t.native !== undefined ? ", chat-shaped copy; " + t.native + " native items" : "") + ")", msgs.map((m) => renderMessage(m, names))));
    loading.replaceWith(...content);
  }
  function closeViewer() {
    viewer.hidden = true;
    document.querySelectorAll(".chip.current").forEach((c) => c.classList.remove("current"));
  }
  function step(by) {
    if (!order.length) return;
    const next = Math.min(Math.max(position + by, 0), order.length - 1);
    if (next !== position) openViewer(order[next][0], order[next][1]);
  }
  $("viewer-close").addEventListener("click", closeViewer);
  $("viewer-prev").addEventListener("click", () => step(-1));
  $("viewer-next").addEventListener("click", () => step(1));
  document.addEventListener("keydown", (e) => {
    if (e.target && (e.target.tagName === "INPUT" || e.target.tagName === "SELECT")) return;
    if (e.key === "Escape") closeViewer();
    else if (!viewer.hidden && (e.key === "j" || e.key === "ArrowDown")) { e.preventDefault(); step(1); }
    else if (!viewer.hidden && (e.key === "k" || e.key === "ArrowUp")) { e.preventDefault(); step(-1); }
  });

  draw();
  document.body.dataset.ready = "1";
})();

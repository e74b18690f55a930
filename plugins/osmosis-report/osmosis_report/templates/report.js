"use strict";
// osmosis report: the row table (sort, filter, pages) and the trajectory viewer.
// Every piece of run content is put on screen as text (text nodes), never parsed as markup, and
// characters that would hide or reorder it (bidirectional controls, zero-width and control
// characters) are drawn as visible markers.
(function () {
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const RUNS = D.runs.length;
  const COMPARE = RUNS > 1;
  const PAGE = 100;
  const state = { text: "", failures: false, never: false, category: "", flip: "", step: "", sort: null, page: 0 };
  const $ = (id) => document.getElementById(id);

  // Characters that show nothing themselves but change how the text around them reads: the
  // bidirectional controls (a RIGHT-TO-LEFT OVERRIDE shows "gnp.exe" as "exe.png"), zero-width
  // ones, and control characters other than tab, newline and carriage return.
  const HIDDEN = "[\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f\\u061c\\u200b\\u200e\\u200f\\u202a-\\u202e\\u2060\\u2066-\\u2069\\ufeff]";
  const HAS_HIDDEN = new RegExp(HIDDEN);
  const SPLIT_HIDDEN = new RegExp("(" + HIDDEN + ")");
  const HIDDEN_NAMES = {
    0x061c: "ARABIC LETTER MARK", 0x200b: "ZERO WIDTH SPACE", 0x200e: "LEFT-TO-RIGHT MARK", 0x200f: "RIGHT-TO-LEFT MARK",
    0x202a: "LEFT-TO-RIGHT EMBEDDING", 0x202b: "RIGHT-TO-LEFT EMBEDDING", 0x202c: "POP DIRECTIONAL FORMATTING",
    0x202d: "LEFT-TO-RIGHT OVERRIDE", 0x202e: "RIGHT-TO-LEFT OVERRIDE", 0x2060: "WORD JOINER",
    0x2066: "LEFT-TO-RIGHT ISOLATE", 0x2067: "RIGHT-TO-LEFT ISOLATE", 0x2068: "FIRST STRONG ISOLATE",
    0x2069: "POP DIRECTIONAL ISOLATE", 0xfeff: "ZERO WIDTH NO-BREAK SPACE",
  };
  const codeOf = (ch) => "U+" + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
  // text for an attribute (a hover title): each hidden character written as <U+202E>
  const plain = (text) => String(text).split(SPLIT_HIDDEN).map((part, n) => (n % 2 ? "<" + codeOf(part) + ">" : part)).join("");
  // nodes for the page: each hidden character as a marked, named box
  function shown(text) {
    text = String(text);
    if (!HAS_HIDDEN.test(text)) return [document.createTextNode(text)];
    return text.split(SPLIT_HIDDEN).filter((part) => part !== "").map((part) => {
      if (!HAS_HIDDEN.test(part)) return document.createTextNode(part);
      const span = document.createElement("span");
      span.className = "hidden-char";
      span.title = codeOf(part) + (HIDDEN_NAMES[part.codePointAt(0)] ? " " + HIDDEN_NAMES[part.codePointAt(0)] : " (a control character)");
      span.textContent = codeOf(part);
      return span;
    });
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.replaceChildren(...shown(v));
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "title") node.setAttribute(k, plain(v));
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(...(child instanceof Node ? [child] : shown(child)));
    }
    return node;
  }
  const fmt = (v, d = 3) => (v === null || v === undefined ? "\u2013" : Number(v).toFixed(d));
  // a duration in the unit that suits it (osmosis_report.units, the same rules)
  const UNITS = [["\u00b5s", 1e-6, 1e-3], ["ms", 1e-3, 1], ["s", 1, 600], ["min", 60, 36000], ["h", 3600, Infinity]];
  const amount = (v) => (Math.abs(v) >= 100 || v === 0 ? Math.round(v).toLocaleString() : v.toFixed(2 - Math.floor(Math.log10(Math.abs(v)))));
  function secs(v) {
    if (v === null || v === undefined) return "\u2013";
    const [unit, size] = UNITS.find((u) => Math.abs(v) < u[2]);
    return amount(v / size) + " " + unit;
  }
  const ROWS = new Map(D.rows.map((row) => [row.i, row]));
  const STEPS = D.steps.length > 0; // a training run: rows are the groups of each policy version (step)
  // the row a trainer named (a training run's report numbers its groups), and a rollout's place in words
  const rowName = (row) => String(row.o !== undefined ? row.o : row.i);
  const placeOf = (ro) => {
    const row = ROWS.get(ro.w);
    return (ro.v !== undefined ? ro.v + " \u00b7 " : "") + "row " + (row ? rowName(row) : ro.w) + ", sample " + ro.s;
  };
  // a trajectory's address in this page: #rollout=<run>:<rollout id> (opens it when the page loads)
  const linkOf = (run, i) => "rollout=" + run + ":" + encodeURIComponent(D.rollouts[run][i].id || "@" + i);

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
    const hay = [rowName(row), row.v || "", row.p, row.l, ...errors,
      ...row.r.flatMap((list, k) => list.map((i) => D.rollouts[k][i].m || ""))].join("\n").toLowerCase();
    const delta = COMPARE && row.m[0] !== null ? row.m.slice(1).map((m) => (m === null ? null : m - row.m[0])) : [];
    return { row, errors, failed, never: graded && !solved, hay, delta };
  });
  const select = $("filter-category");
  for (const c of D.categories) select.append(el("option", { value: c, text: c }));
  const stepSelect = $("filter-step");
  for (const v of D.steps) stepSelect.append(el("option", { value: v, text: v }));
  stepSelect.hidden = !STEPS;

  function visible() {
    const text = state.text.trim().toLowerCase();
    let out = rows.filter((x) =>
      (!text || x.hay.includes(text)) &&
      (!state.failures || x.failed) &&
      (!state.never || x.never) &&
      (!state.category || x.errors.includes(state.category)) &&
      (!state.step || x.row.v === state.step) &&
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

  const columns = [{ title: "row", key: (x) => (x.row.o !== undefined ? x.row.o : x.row.i), cls: "num idx",
    tip: STEPS ? "the row the trainer named in its batch (with the step: one group of samples)" : null }];
  if (STEPS) columns.push({ title: "step", key: (x) => x.row.i, tip: "the policy version (training step) of the row's rollouts; sorts in training order" });
  columns.push({ title: "prompt" }, { title: "label" });
  for (let k = 0; k < RUNS; k++) {
    const name = COMPARE ? (k + 1) + ". " : "";
    columns.push({ title: name + "samples", run: k, kind: "chips" });
    columns.push({ title: name + "mean", run: k, kind: "mean", key: (x) => x.row.m[k], cls: "num", tip: "mean reward of the row's graded rollouts, a failed rollout counting as 0" });
    columns.push({ title: name + "pass", run: k, kind: "pass", key: (x) => (x.row.pc[k][1] ? x.row.pc[k][0] / x.row.pc[k][1] : null), cls: "num", tip: "graded rollouts that passed, of the row's graded rollouts (a failure counts, as not passing)" });
  }
  if (COMPARE) for (let k = 1; k < RUNS; k++) columns.push({ title: "\u0394 " + (k + 1) + " vs 1", kind: "delta", run: k, key: (x) => x.delta[k - 1], cls: "num", tip: "the row's mean reward in run " + (k + 1) + " minus in run 1 (a failed rollout counting as 0)" });
  columns.push({ title: "errors", key: (x) => x.errors.length || null });

  function head() {
    const tr = el("tr");
    columns.forEach((col) => {
      const th = el("th", { class: col.key ? "sortable" : null, text: col.title, title: col.tip || null });
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
    if (ro.cv) bits.push("off-policy");
    return bits.join(" \u00b7 ");
  }

  function cell(col, x) {
    const row = x.row;
    if (col.title === "row") return el("td", { class: col.cls, text: rowName(row) });
    if (col.title === "step") return el("td", { class: "step", text: row.v !== undefined ? row.v : "\u2013" });
    if (col.title === "prompt") return el("td", { class: "prompt" }, el("div", { text: row.p, title: row.p }));
    if (col.title === "label") return el("td", { class: "label", text: row.l, title: row.l });
    if (col.title === "errors") return el("td", {}, x.errors.map((c) => el("span", { class: "tag cat", text: c })));
    const k = col.run;
    if (col.kind === "chips") {
      if (!row.r[k].length && COMPARE) {
        const [text, title] = (row.u || []).includes(k) ? ["other prompt", "run " + (k + 1) + "'s row " + row.i + " has another prompt than the one shown: not compared"]
          : (row.x || []).includes(k) ? ["missing", "run " + (k + 1) + " has no row " + row.i] : ["not run", "run " + (k + 1) + " has no result for row " + row.i + " (yet)"];
        return el("td", { class: "muted", text, title });
      }
      return el("td", {}, el("div", { class: "chips" }, row.r[k].map((i) => {
        const ro = D.rollouts[k][i];
        return el("a", { href: "#" + linkOf(k, i), class: "chip " + chipClass(ro), title: chipTitle(ro), "data-run": k, "data-rollout": i,
          onclick: (e) => { e.preventDefault(); openViewer(k, i, rowOrder()); } });
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
  stepSelect.addEventListener("change", (e) => { state.step = e.target.value; state.page = 0; draw(); });
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

  // a long text shows its start, with a button that unfolds the whole of it (and folds it again)
  const FOLD_CHARS = 2000, FOLD_LINES = 40;
  function longText(tag, cls, text) {
    text = String(text === null || text === undefined ? "" : text);
    let cut = -1;
    if (text.length > FOLD_CHARS) cut = FOLD_CHARS;
    else {
      const lines = text.split("\n");
      if (lines.length > FOLD_LINES) cut = lines.slice(0, FOLD_LINES).join("\n").length;
    }
    if (cut < 0) return el(tag, { class: cls, text });
    const box = el(tag, { class: cls + " folded", text: text.slice(0, cut) + "\u2026" });
    const rest = (text.length - cut).toLocaleString();
    const button = el("button", { type: "button", class: "unfold", text: "show all (" + rest + " more characters)" });
    button.addEventListener("click", () => {
      const folded = box.classList.toggle("folded");
      box.replaceChildren(...shown(folded ? text.slice(0, cut) + "\u2026" : text));
      button.textContent = folded ? "show all (" + rest + " more characters)" : "show less";
    });
    return el("div", { class: "long" }, box, button);
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
      box.append(longText("div", "text", content || ""));
    } else if (Array.isArray(content)) {
      for (const part of content) {
        if (typeof part === "string" || (part && typeof part.text === "string" && Object.keys(part).length <= 2)) box.append(longText("div", "text", typeof part === "string" ? part : part.text));
        else if (part && part.toolUse) blocks.push(el("div", { class: "call tool-call" }, el("div", { class: "fn", text: "\u2192 " + part.toolUse.name + " \u00b7 " + (part.toolUse.toolUseId || "") }), longText("pre", "", pretty(part.toolUse.input))));
        else if (part && part.toolResult) blocks.push(el("div", { class: "call" }, el("div", { class: "fn", text: "\u2190 result \u00b7 " + (part.toolResult.toolUseId || "") + " " + (part.toolResult.status || "") }), longText("pre", "", textOf(part.toolResult.content) || pretty(part.toolResult.content))));
        else if (part && (part.type === "image_url" || part.image)) box.append(el("div", { class: "text muted", text: "[image not shown]" }));
        else blocks.push(longText("pre", "json", pretty(part)));
      }
    } else {
      blocks.push(longText("pre", "json", pretty(content)));
    }
    for (const call of m.tool_calls || []) {
      const fn = call.function || {};
      names[call.id] = fn.name;
      blocks.push(el("div", { class: "call tool-call" }, el("div", { class: "fn", text: "\u2192 " + (fn.name || "?") + (call.id ? " \u00b7 " + call.id : "") }), longText("pre", "args", pretty(fn.arguments))));
    }
    if (!m.role && !m.content) blocks.push(longText("pre", "json", pretty(m)));
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
    const link = "#" + linkOf(run, i);
    $("viewer-link").setAttribute("href", link);
    if (location.hash !== link) {
      try { history.replaceState(null, "", link); } catch (e) { /* a page that may not change its address */ }
    }
    const status = ro.st === 0 ? "success" : ro.st === 1 ? "failure" : "cancelled";
    $("viewer-title").replaceChildren(el("span", { text: (COMPARE ? (run + 1) + ". " + D.runs[run].name + " \u00b7 " : "") + placeOf(ro) }),
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
    const row = ROWS.get(ro.w);
    const own = row && !(row.u || []).includes(run);
    parts.push(section("row", kv([
      ["row", row ? rowName(row) : String(ro.w)],
      ["policy version", ro.v],
      ["label", !own ? "(this run's row has another prompt than the one shown)" : row.L || row.l || "none"],
    ])));
    parts.push(section("rollout", kv([
      ["rollout id", ro.id], ["status", status], ["reward", ro.rw === undefined ? "none" : fmt(ro.rw, 4)],
      ["passed", ro.p === undefined ? "not graded" : ro.p ? "yes" : "no"], ["attempts", ro.a || 1],
      ["off-policy", ro.cv ? "yes: its calls were served by " + ro.cv.map((v) => (v === null ? "(none)" : v)).join(", ") : null],
      ["finished", ro.f !== undefined ? "+" + ro.f.toFixed(1) + " s after the first rollout" : null],
    ]), ro.t ? timingBar(ro.t) : null));
    if (ro.k) {
      parts.push(section("tokens (trace)", kv([["model calls", ro.k[0]], ["prompt tokens", ro.k[1].toLocaleString()], ["generated tokens", ro.k[2].toLocaleString()], ["trace complete", ro.k[3] ? "yes" : "no"],
        ["per call (prompt / generated)", ro.k[4].map((c) => c[0] + " / " + c[1]).join(", ")]])));
    }
    const metric = ([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)];
    const metrics = Object.entries(ro.x || {});
    if (ro.gm) {
      const byGrader = new Set(ro.gm);
      const own = metrics.filter(([k]) => !byGrader.has(k)), grader = metrics.filter(([k]) => byGrader.has(k));
      if (own.length) parts.push(section("workflow metrics", kv(own.map(metric))));
      if (grader.length) parts.push(section("grader metrics", kv(grader.map(metric))));
    } else if (metrics.length) {
      parts.push(section("metrics", el("div", { class: "muted", text: "which stage set each is not recorded (results written before osmosis 0.2)" }), kv(metrics.map(metric))));
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
    if (sys) content.push(section("system prompt", el("div", { class: "msg system" }, longText("div", "text", sys))));
    content.push(section("messages (" + msgs.length + (t.native !== undefined ? ", chat-shaped copy; " + t.native + " native items" : "") + ")", msgs.map((m) => renderMessage(m, names))));
    loading.replaceWith(...content);
  }
  function closeViewer() {
    viewer.hidden = true;
    document.querySelectorAll(".chip.current").forEach((c) => c.classList.remove("current"));
    if (location.hash) {
      try { history.replaceState(null, "", location.pathname + location.search); } catch (e) { /* as above */ }
    }
  }
  // #rollout=<run>:<rollout id>: open that trajectory (a link copied from the viewer or a square)
  function openFromHash() {
    const match = /^#rollout=(\d+):(.*)$/.exec(location.hash);
    if (!match) return;
    const run = Number(match[1]), id = decodeURIComponent(match[2]);
    const list = D.rollouts[run] || [];
    const i = id.startsWith("@") && !list.some((ro) => ro.id === id) ? Number(id.slice(1)) : list.findIndex((ro) => ro.id === id);
    if (i >= 0 && i < list.length && (viewer.hidden || viewer.dataset.run !== String(run) || viewer.dataset.rollout !== String(i))) {
      openViewer(run, i, rows.flatMap((x) => x.row.r.flatMap((l, k) => l.map((j) => [k, j]))));
    }
  }
  window.addEventListener("hashchange", openFromHash);
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
  openFromHash();
  document.body.dataset.ready = "1";
})();

// modelmux dashboard: polls /-/dashboard/state every second while the tab is visible (a hidden
// tab asks for nothing) and keeps the page in step with it, updating elements in place (keyed by application, deployment, node, replica and model)
// so that nothing flickers and no input loses its focus or value. Actions are the admin API's
// own calls. No framework, no build step; charts by uPlot (vendored, MIT).
"use strict";
(() => {
  const TOKEN_KEY = "modelmux.adminToken"; // sessionStorage: this tab only, never the URL
  // A server started without http_options.admin_token keeps the one it made in a file only its
  // account reads (crates/cli/src/local_admin.rs): say where to find it.
  const NEEDS_TOKEN = "This server needs its admin token (401): enter it above to see the models. " +
    "A server started without one wrote one for its account: `modelmux token` prints it " +
    "(it is in $XDG_RUNTIME_DIR/modelmux/admin-<port>.token, or ~/.local/state/modelmux/).";
  const POLL_MS = 1000;
  const CHART_HEIGHT = 110;
  const COLORS = ["#2563eb", "#d97706", "#dc2626", "#16a34a", "#7c3aed"];

  const $ = (selector) => document.querySelector(selector);
  const tokenInput = $("#admin-token");
  const pollStatus = $("#poll-status");
  const actionStatus = $("#action-status");
  const appsEl = $("#apps");

  let authRequired = false; // the server answered 401 once: it has an admin token
  let pollTimer = 0;
  let inFlight = false;
  let again = false;
  let now = 0; // the last state's time
  let span = 300; // the longest the charts show, in seconds (300 samples)
  const charts = new Map(); // deployment key -> [{spec, u, wrap}]
  const busy = new Set(); // "deployment\nmodel" with an action in flight

  // ---- small DOM helpers ---------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === "text") el.textContent = v;
      else el.setAttribute(k === "cls" ? "class" : k, v === true ? "" : String(v));
    }
    for (const c of children) if (c != null) el.append(c);
    return el;
  }
  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }
  function setAttr(el, name, value) {
    if (el.getAttribute(name) !== value) el.setAttribute(name, value);
  }
  function toggle(el, cls, on) {
    if (el.classList.contains(cls) !== on) el.classList.toggle(cls, on);
  }
  function show(el, on) {
    if (el.hidden === on) el.hidden = !on;
  }

  // Makes `container`'s children one element per item, in order, keyed by `key(item)`:
  // existing elements are updated in place (and moved only when the order changed), new ones
  // created, gone ones removed (after `gone(el)`).
  function sync(container, items, key, create, update, gone) {
    const old = new Map();
    for (const el of container.children) old.set(el.dataset.key, el);
    let prev = null;
    for (const item of items) {
      const k = key(item);
      let el = old.get(k);
      if (el) old.delete(k);
      else {
        el = create(item);
        el.dataset.key = k;
      }
      const want = prev ? prev.nextElementSibling : container.firstElementChild;
      if (want !== el) container.insertBefore(el, want);
      update(el, item);
      prev = el;
    }
    for (const el of old.values()) {
      if (gone) gone(el);
      el.remove();
    }
  }

  // ---- formatting ----------------------------------------------------------------------

  function bytes(n) {
    if (n == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return (i === 0 || n >= 100 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
  }
  function duration(s) {
    if (s == null) return "–";
    if (s < 1) return "<1s";
    if (s < 60) return Math.floor(s) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (Math.floor(s) % 60) + "s";
    return Math.floor(s / 3600) + "h " + (Math.floor(s / 60) % 60) + "m";
  }
  function num(v) {
    if (v == null || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100 || Number.isInteger(v)) return String(Math.round(v));
    return v.toFixed(a >= 10 ? 1 : 2);
  }
  function pct(v) {
    return v == null || !isFinite(v) ? "–" : (v * 100).toFixed(v >= 0.1 || v === 0 ? 0 : 1) + "%";
  }
  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString();
  }
  const byId = (a, b) => a.localeCompare(b, undefined, { numeric: true });

  // ---- token and status lines ----------------------------------------------------------

  function token() {
    return tokenInput.value.trim();
  }
  function headers(json) {
    const out = {};
    if (json) out["Content-Type"] = "application/json";
    const t = token();
    if (t) out.Authorization = "Bearer " + t;
    return out;
  }
  function tokenChanged() {
    const t = token();
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
    schedule(0);
  }
  function setPoll(state, text) {
    setAttr(pollStatus, "data-state", state);
    setText(pollStatus, text);
    toggle(appsEl, "stale", state !== "ok");
  }
  function setAction(result, text) {
    setAttr(actionStatus, "data-result", result);
    setText(actionStatus, text);
  }
  // The message of an error answer: `{"error": {"message": ...}}`, else its text.
  function errorText(status, text) {
    let message = text.trim();
    try {
      const body = JSON.parse(text);
      if (body && body.error) message = body.error.message || JSON.stringify(body.error);
    } catch (_) {
      // Not JSON: the text itself.
    }
    return "HTTP " + status + (message ? ": " + message : "");
  }

  // ---- polling -------------------------------------------------------------------------

  function schedule(ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, ms);
  }

  async function poll() {
    if (document.hidden) {
      // A tab nobody sees asks for nothing; `visibilitychange` starts polling again.
      setPoll("paused", "Paused while this tab is hidden.");
      return;
    }
    if (inFlight) {
      again = true;
      return;
    }
    if (authRequired && !token()) {
      // Asking again without a token would only be refused: wait for one.
      setPoll("auth", NEEDS_TOKEN);
      return;
    }
    inFlight = true;
    let next = POLL_MS;
    try {
      const sent = token();
      const r = await fetch("/-/dashboard/state", { headers: headers(false), cache: "no-store" });
      if (r.status === 401) {
        authRequired = true;
        next = -1; // until the token changes
        setPoll("auth", sent
          ? "The server refused this admin token (401): enter the right one above."
          : NEEDS_TOKEN);
      } else if (!r.ok) {
        next = 2 * POLL_MS;
        setPoll("error", "Cannot read the state (" + errorText(r.status, await r.text()) + "); retrying.");
      } else {
        render(await r.json());
        setPoll("ok", "Updated " + clock(Date.now() / 1000));
        appsEl.removeAttribute("aria-busy");
      }
    } catch (e) {
      next = 2 * POLL_MS;
      setPoll("error", "Cannot reach the server (" + e.message + "); retrying.");
    } finally {
      inFlight = false;
    }
    if (again) {
      again = false;
      schedule(0);
    } else if (next >= 0) {
      schedule(next);
    }
  }

  // ---- rendering -----------------------------------------------------------------------

  function render(state) {
    now = state.time || Date.now() / 1000;
    span = 300 * (state.interval_seconds || 1);
    const series = new Map();
    for (const d of state.deployments || []) series.set(d.app + "/" + d.deployment, d);
    const apps = ((state.models && state.models.applications) || []).map((app) => ({
      app,
      deps: app.deployments.map((dep) => ({ app: app.name, dep, series: series.get(app.name + "/" + dep.name) })),
    }));
    if (!apps.length) {
      sync(appsEl, [null], () => "\n", () => h("p", { cls: "empty", text: "No applications." }), () => {}, gone);
      return;
    }
    sync(appsEl, apps, (a) => a.app.name, createApp, updateApp, gone);
    function gone(el) {
      for (const dep of el.querySelectorAll(".deployment")) dropCharts(dep.dataset.key);
    }
  }

  function createApp(a) {
    return h("section", { cls: "app", "data-app": a.app.name },
      h("h2", {}, h("span", { cls: "name", text: a.app.name }), h("span", { cls: "route" })),
      h("div", { cls: "deps" }));
  }
  function updateApp(el, a) {
    setText(el.querySelector(".route"), a.app.route_prefix);
    sync(el.querySelector(".deps"), a.deps, (d) => d.app + "/" + d.dep.name, createDeployment,
      updateDeployment, (dep) => dropCharts(dep.dataset.key));
  }

  function createDeployment(d) {
    const form = h("form", { cls: "load-form", "data-load-form": d.dep.name },
      h("input", { name: "model_id", type: "text", placeholder: "model id", required: true,
        autocomplete: "off", spellcheck: "false", "aria-label": "model id to load into " + d.dep.name }),
      h("label", { title: "keep it loaded: never evicted until unpinned" },
        h("input", { type: "checkbox", name: "pin" }), "pin"),
      h("button", { type: "submit", text: "Load" }));
    return h("article", { cls: "deployment", "data-deployment-card": d.dep.name },
      h("div", { cls: "dep-head" },
        h("h3", { text: d.dep.name }),
        h("span", { cls: "badge llm", text: "LLM", hidden: true }),
        h("span", { cls: "dep-facts" }),
        form),
      h("div", { cls: "charts" }),
      h("div", { cls: "nodes" }));
  }

  function updateDeployment(el, d) {
    const reps = d.dep.replicas || [];
    const up = reps.filter((r) => r.available).length;
    const ongoing = reps.reduce((s, r) => s + (r.ongoing_requests || 0), 0);
    const models = reps.reduce((s, r) => s + r.loaded.length, 0);
    const facts = el.querySelector(".dep-facts");
    setText(facts, up + "/" + reps.length + " replicas available · " + d.dep.queued_requests +
      " queued · " + ongoing + " ongoing · " + models + (models === 1 ? " model" : " models") + " loaded");
    toggle(facts, "busy", d.dep.queued_requests > 0 || up < reps.length);
    const llm = d.series && d.series.llm;
    show(el.querySelector(".badge.llm"), !!llm);
    updateCharts(el.dataset.key, el.querySelector(".charts"), d.series);

    // Replicas, by node when they have one (a cluster); this node's first.
    const nodes = new Map();
    for (const r of reps) {
      const n = r.node || "";
      if (!nodes.has(n)) nodes.set(n, []);
      nodes.get(n).push(r);
    }
    const groups = [...nodes.entries()].map(([node, list]) => ({ node, list, dep: d.dep.name }));
    groups.sort((a, b) => (a.list.every((r) => r.remote) - b.list.every((r) => r.remote)) || byId(a.node, b.node));
    const clustered = groups.some((g) => g.node !== "");
    const nodesEl = el.querySelector(".nodes");
    if (!groups.length) {
      sync(nodesEl, [null], () => "\n", () => h("p", { cls: "none", text: "No replicas." }), () => {});
      return;
    }
    sync(nodesEl, groups, (g) => g.node, createNode, (nodeEl, g) => {
      const head = nodeEl.querySelector("h4");
      show(head, clustered);
      setText(head, g.node ? "node " + g.node + (g.list.every((r) => r.remote) ? " (remote)" : "") : "no node");
      sync(nodeEl.querySelector(".replicas"), g.list, (r) => r.id, (r) => createReplica(r, g.dep), updateReplica);
    });
  }

  function createNode(g) {
    return h("div", { cls: "node", "data-node": g.node }, h("h4", {}), h("div", { cls: "replicas" }));
  }

  function createReplica(r, deployment) {
    const cols = ["model", "state", "size", "idle", "in use", ""].map((c, i) =>
      h("th", { cls: i >= 2 && i <= 4 ? "num" : null, text: c }));
    return h("div", { cls: "replica", "data-replica": r.id, "data-deployment": deployment },
      h("div", { cls: "rep-head" },
        h("span", { cls: "rid", text: r.id }),
        h("span", { cls: "badge avail" }),
        h("span", { cls: "badge remote", text: "remote", hidden: true }),
        h("span", { cls: "load" })),
      h("div", { cls: "meter", title: "ongoing / max ongoing requests" }, h("div")),
      h("table", { cls: "models" }, h("thead", {}, h("tr", {}, ...cols)), h("tbody")),
      h("div", { cls: "none", text: "No models loaded." }));
  }

  function updateReplica(el, r) {
    toggle(el, "unavailable", !r.available);
    toggle(el, "remote", !!r.remote);
    const avail = el.querySelector(".badge.avail");
    setText(avail, r.available ? "available" : "unavailable");
    toggle(avail, "up", !!r.available);
    toggle(avail, "down", !r.available);
    show(el.querySelector(".badge.remote"), !!r.remote);
    const bytesLoaded = r.loaded.reduce((s, m) => s + (m.size_bytes || 0), 0);
    let load = r.ongoing_requests + " / " + r.max_ongoing_requests + " ongoing";
    if (r.waiting_for_load) load += " · " + r.waiting_for_load + " waiting for a load";
    if (bytesLoaded) load += " · " + bytes(bytesLoaded);
    setText(el.querySelector(".load"), load);
    const meter = el.querySelector(".meter");
    const fill = r.max_ongoing_requests ? Math.min(1, r.ongoing_requests / r.max_ongoing_requests) : 0;
    const width = (fill * 100).toFixed(1) + "%";
    if (meter.firstElementChild.style.width !== width) meter.firstElementChild.style.width = width;
    toggle(meter, "full", fill >= 1);

    const loadedIds = new Set(r.loaded.map((m) => m.id));
    const rows = r.loaded.map((m) => ({ m, state: "loaded" }))
      .concat((r.loading || []).filter((id) => !loadedIds.has(id)).map((id) => ({ m: { id }, state: "loading" })))
      // Evicted, its last requests (or its unload) still running; it may be loaded again too.
      .concat((r.draining || []).map((id) => ({ m: { id }, state: "draining" })));
    rows.sort((a, b) => byId(a.m.id, b.m.id) || (a.state === "draining") - (b.state === "draining"));
    const deployment = el.dataset.deployment;
    sync(el.querySelector("tbody"), rows, (x) => (x.state === "draining" ? "draining\n" : "") + x.m.id,
      createModel, (row, x) => updateModel(row, x, deployment));
    show(el.querySelector("table"), rows.length > 0);
    show(el.querySelector(".none"), rows.length === 0);
  }

  function createModel(x) {
    return h("tr", { "data-model": x.m.id },
      h("td", { cls: "id", text: x.m.id }),
      h("td", { cls: "state" }, h("span", { cls: "badge st" }), " ",
        h("span", { cls: "badge pinned", text: "pinned", hidden: true })),
      h("td", { cls: "num size" }),
      h("td", { cls: "num idle" }),
      h("td", { cls: "num inuse" }),
      h("td", { cls: "acts" },
        h("button", { type: "button", "data-action": "pin" }), " ",
        h("button", { type: "button", "data-action": "evict", text: "evict",
          title: "unload it from every replica of this deployment" })));
  }

  function updateModel(row, x, deployment) {
    const m = x.m;
    const pinned = m.pinned === true;
    setAttr(row, "data-state", x.state);
    setAttr(row, "data-pinned", String(pinned));
    const st = row.querySelector(".badge.st");
    setText(st, x.state);
    toggle(st, "loading", x.state !== "loaded");
    show(row.querySelector(".badge.pinned"), pinned);
    setText(row.querySelector(".size"), x.state !== "loaded" ? "" : bytes(m.size_bytes));
    setText(row.querySelector(".idle"), duration(m.idle_seconds));
    setText(row.querySelector(".inuse"), m.in_use == null ? "–" : String(m.in_use));
    const pin = row.querySelector('[data-action="pin"], [data-action="unpin"]');
    setAttr(pin, "data-action", pinned ? "unpin" : "pin");
    setText(pin, pinned ? "unpin" : "pin");
    setAttr(pin, "title", pinned ? "let it be evicted again" : "keep it loaded: never evicted until unpinned");
    // A draining copy takes no action: it is already on its way out.
    const isBusy = busy.has(deployment + "\n" + m.id) || x.state === "draining";
    for (const b of row.querySelectorAll("button")) if (b.disabled !== isBusy) b.disabled = isBusy;
  }

  // ---- charts --------------------------------------------------------------------------

  const at = (path) => (s) => path.reduce((o, k) => (o == null ? null : o[k]), s);
  const CHARTS = [
    { title: "Requests/s", series: [["req/s", at(["requests_per_second"])]] },
    { title: "Error ratio", ratio: true, series: [["errors", at(["error_ratio"])]] },
    { title: "Latency (ms)", series: [["p50", at(["latency_ms", "p50"])], ["p95", at(["latency_ms", "p95"])],
      ["p99", at(["latency_ms", "p99"])]] },
    { title: "Cache hit ratio", ratio: true, series: [["hits", at(["hit_ratio"])]] },
    { title: "Loads and evictions /s", series: [["loads", at(["loads_per_second"])],
      ["evictions", at(["evictions_per_second"])]] },
    { title: "Requests ongoing and queued", series: [["ongoing", at(["ongoing"])], ["queued", at(["queued"])]] },
  ];
  const LLM_CHARTS = [
    { title: "Tokens/s", series: [["generated", at(["llm", "generation_tokens_per_second"])],
      ["prompt", at(["llm", "prompt_tokens_per_second"])]] },
    { title: "Time to first token p50 (ms)", series: [["ttft p50", at(["llm", "ttft_ms_p50"])]] },
    { title: "Sequences", series: [["running", at(["llm", "running"])], ["waiting", at(["llm", "waiting"])]] },
    { title: "KV cache use", ratio: true, series: [["kv", at(["llm", "kv_usage"])]] },
    { title: "Adapters loaded", series: [["adapters", at(["llm", "adapters_loaded"])]] },
  ];

  function cssVar(name, fallback) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
  }

  // Charts scrolled out of view keep their data but are drawn only when they come back.
  const onScreen = new WeakMap(); // chart wrapper -> its chart
  const viewport = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
    for (const e of entries) {
      const c = onScreen.get(e.target);
      if (!c) continue;
      c.visible = e.isIntersecting;
      if (c.visible && c.pending) draw(c);
    }
  });

  function makeChart(parent, spec) {
    const c = { spec, win: [now - 60, now], visible: !viewport, pending: null };
    const wrap = h("div", { cls: "chart" }, h("h4", { text: spec.title }));
    parent.append(wrap);
    onScreen.set(wrap, c);
    if (viewport) viewport.observe(wrap);
    const ink = cssVar("--muted", "#667085");
    const grid = cssVar("--line", "#dfe3ea");
    const fmt = spec.ratio ? pct : num;
    const axis = { stroke: ink, font: "10px system-ui, sans-serif", grid: { stroke: grid, width: 1 },
      ticks: { stroke: grid, width: 1, size: 3 } };
    const opts = {
      width: Math.max(180, wrap.clientWidth || 250),
      height: CHART_HEIGHT,
      cursor: { drag: { x: false, y: false, setScale: false } },
      select: { show: false },
      legend: { show: true, live: true },
      scales: {
        x: { time: true, range: () => c.win },
        y: { range: spec.ratio ? () => [0, 1] : (u, min, max) => [0, max > 0 ? max * 1.15 : 1] },
      },
      axes: [
        Object.assign({ size: 22, space: 50 }, axis),
        Object.assign({ size: 38, space: 20, values: (u, vals) => vals.map(fmt) }, axis),
      ],
      series: [{ value: (u, v) => (v == null ? "–" : clock(v)) }].concat(spec.series.map(([label], i) => ({
        label,
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        fill: spec.series.length === 1 ? COLORS[i] + "1f" : undefined,
        value: (u, v) => fmt(v),
      }))),
    };
    c.wrap = wrap;
    c.u = new uPlot(opts, [[]].concat(spec.series.map(() => [])), wrap);
    return c;
  }

  function updateCharts(key, parent, s) {
    if (typeof uPlot === "undefined") return;
    let list = charts.get(key);
    if (!list) {
      list = CHARTS.map((spec) => makeChart(parent, spec));
      charts.set(key, list);
    }
    if (s && s.llm && list.length === CHARTS.length) {
      for (const spec of LLM_CHARTS) list.push(makeChart(parent, spec));
    }
    const t = (s && s.t) || [];
    // The last minute at least, up to the last `span` seconds as samples accumulate.
    const win = [Math.max(now - span, Math.min(t.length ? t[0] : now, now - 60)), now];
    for (const c of list) {
      const data = [t].concat(c.spec.series.map(([, get]) => {
        const v = s ? get(s) : null;
        return Array.isArray(v) ? v : t.map(() => null);
      }));
      c.pending = { win, data, last: t.length ? t.length - 1 : null };
      if (c.visible) draw(c);
    }
  }

  function draw(c) {
    const { win, data, last } = c.pending;
    c.pending = null;
    c.win = win;
    c.u.setData(data);
    // Away from the cursor, the legend shows the latest values.
    if (c.u.cursor.left == null || c.u.cursor.left < 0) c.u.setLegend({ idx: last });
  }

  function dropCharts(key) {
    for (const c of charts.get(key) || []) {
      if (viewport) viewport.unobserve(c.wrap);
      c.u.destroy();
    }
    charts.delete(key);
  }

  let resizeTimer = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const list of charts.values()) {
        for (const c of list) {
          const width = Math.max(180, c.wrap.clientWidth);
          if (width !== c.u.width) c.u.setSize({ width, height: CHART_HEIGHT });
        }
      }
    }, 150);
  });

  // ---- actions -------------------------------------------------------------------------

  const ACTIONS = {
    pin: { verb: "Pin", done: "Pinned", method: "POST", path: "/load?pin=true" },
    load: { verb: "Load", done: "Loaded", method: "POST", path: "/load" },
    unpin: { verb: "Unpin", done: "Unpinned", method: "POST", path: "/unpin" },
    evict: { verb: "Evict", done: "Evicted", method: "DELETE", path: "" },
  };

  function outcome(action, body) {
    if (!body) return "";
    if (body.replica) return " (replica " + body.replica + ")";
    const list = action === "unpin" ? body.unpinned_on : action === "evict" ? body.evicted_from : null;
    if (Array.isArray(list)) {
      if (!list.length) return action === "unpin" ? " (it was not pinned on any replica)" : "";
      return (action === "unpin" ? " (on " : " (from ") + list.join(", ") + ")";
    }
    return "";
  }

  async function act(action, deployment, model, buttons, onDone) {
    const a = ACTIONS[action];
    const what = "'" + model + "' on " + deployment;
    const url = "/-/models/" + encodeURIComponent(deployment) + "/" + encodeURIComponent(model) + a.path;
    const key = deployment + "\n" + model;
    busy.add(key);
    for (const b of buttons) b.disabled = true;
    setAction("pending", a.verb + " " + what + "…");
    try {
      const r = await fetch(url, { method: a.method, headers: headers(true), body: "{}", cache: "no-store" });
      const text = await r.text();
      if (r.ok) {
        let body = null;
        try {
          body = JSON.parse(text);
        } catch (_) {
          // An empty or non-JSON success: nothing more to say.
        }
        setAction("ok", a.done + " " + what + outcome(action, body) + " at " + clock(Date.now() / 1000) + ".");
        if (onDone) onDone();
      } else {
        let text2 = a.verb + " " + what + " refused: " + errorText(r.status, text);
        if (r.status === 401) text2 += " (enter the admin token above)";
        setAction("error", text2);
      }
    } catch (e) {
      setAction("error", a.verb + " " + what + " failed: " + e.message);
    } finally {
      busy.delete(key);
      for (const b of buttons) b.disabled = false;
      schedule(0);
    }
  }

  appsEl.addEventListener("click", (e) => {
    const button = e.target.closest("button[data-action]");
    if (!button) return;
    const row = button.closest("[data-model]");
    const replica = button.closest("[data-deployment]");
    if (!row || !replica) return;
    act(button.dataset.action, replica.dataset.deployment, row.dataset.model, row.querySelectorAll("button"));
  });

  appsEl.addEventListener("submit", (e) => {
    const form = e.target.closest("form[data-load-form]");
    if (!form) return;
    e.preventDefault();
    const input = form.elements.model_id;
    const id = input.value.trim();
    if (!id) return;
    act(form.elements.pin.checked ? "pin" : "load", form.dataset.loadForm, id, [form.querySelector("button")],
      () => {
        if (input.value.trim() === id) input.value = "";
      });
  });

  // ---- start ---------------------------------------------------------------------------

  tokenInput.value = sessionStorage.getItem(TOKEN_KEY) || "";
  tokenInput.addEventListener("input", tokenChanged);
  tokenInput.addEventListener("change", tokenChanged);
  $("#token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    tokenChanged();
  });
  $("#token-clear").addEventListener("click", () => {
    tokenInput.value = "";
    tokenChanged();
    tokenInput.focus();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) clearTimeout(pollTimer);
    else schedule(0);
  });
  poll();
})();

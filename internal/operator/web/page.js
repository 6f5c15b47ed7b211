// The operator page's script: it reads GET /v1/stats every two seconds and
// draws the figures, and looks a subject up with POST /v1/usage when asked.
// Everything it shows comes from there, written with textContent (never as
// HTML: subjects are whatever clients sent).
//
// When the service has an API token, /v1/stats answers 401 and the page asks
// for the token; it is kept in sessionStorage (this tab only) and sent as
// "Authorization: Bearer". A token in the address's fragment (#token=...),
// which browsers never send to the server, is taken the same way and removed
// from the address at once.
"use strict";

(function () {
  const INTERVAL_MS = 2000;
  const TOKEN_KEY = "ratelimit-token";
  const SVG = "http://www.w3.org/2000/svg";
  const OUTAGE = {
    "local-fallback": "local-fallback: limits from buckets in this process",
    "fail-open": "fail-open: every check is allowed, unlimited",
    "fail-closed": "fail-closed: every check is denied (503)",
    "return-error": "return-error: checks fail with 503",
  };
  const KIND = { embedded: "Embedded (memory of this process)", redis: "Redis", cluster: "Redis Cluster" };

  const $ = (id) => document.getElementById(id);
  let paused = false;
  let timer = 0;
  let lastOK = null;
  let lastPrimary = null;
  let lastReport = null;

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }
  function setToken(t) {
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* storage disabled: the token lasts until reload */ }
    $("forget").hidden = !t;
  }
  // takeFragmentToken takes the token of #token=..., and removes the
  // fragment from the address either way. A fragment that does not decode
  // (a bad percent escape) gives no token: the form asks for it, saying why.
  let fragmentError = "";
  function takeFragmentToken() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (!m) return;
    try {
      setToken(decodeURIComponent(m[1]));
    } catch (e) {
      fragmentError = "The token in the address (#token=...) is not validly encoded; type it here.";
    }
    history.replaceState(null, "", location.pathname + location.search);
  }

  // el builds an element: el("td", {class: "num"}, "12").
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, v);
    }
    for (const c of children) e.append(c);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  const fmtInt = new Intl.NumberFormat("en-US");
  const fmtRate = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
  function num(n) { return fmtInt.format(n); }
  function rate(n) { return fmtRate.format(n) + "/s"; }
  function ms(x) {
    if (x >= 1000) return fmtRate.format(x / 1000) + " s";
    if (x >= 1) return fmtRate.format(x) + " ms";
    return fmtInt.format(Math.round(x * 1000)) + " µs";
  }
  function clock(iso) {
    const d = new Date(iso);
    return d.toLocaleTimeString("en-GB", { hour12: false });
  }
  function ago(iso, now) {
    const s = Math.max(0, Math.round((new Date(now) - new Date(iso)) / 1000));
    if (s < 120) return s + " s ago";
    if (s < 7200) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }
  function when(iso, now) {
    return clock(iso) + " (" + ago(iso, now) + ")";
  }
  function state(up, words) {
    return el("span", { class: "state " + (up ? "up" : "down") }, (up ? "✓ " : "✗ ") + words);
  }

  function status(text, stale) {
    const s = $("status");
    s.textContent = text;
    s.classList.toggle("stale", !!stale);
  }

  function schedule() {
    clearTimeout(timer);
    if (!paused) timer = setTimeout(refresh, INTERVAL_MS);
  }

  async function refresh() {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    let res;
    try {
      res = await fetch("v1/stats", { headers, cache: "no-store", credentials: "omit" });
    } catch (e) {
      unreachable("the service does not answer");
      return;
    }
    if (res.status === 401) {
      askToken(t ? "The service refused this token." : "");
      return;
    }
    if (!res.ok) {
      unreachable("/v1/stats answered " + res.status);
      return;
    }
    let r;
    try { r = await res.json(); } catch (e) { unreachable("/v1/stats sent no JSON"); return; }
    $("token-form").hidden = true;
    $("report").hidden = false;
    lastOK = r.time;
    lastReport = r;
    render(r);
    status("Updated " + clock(r.time) + ". Service up since " + clock(r.started) + "." +
      (paused ? " Updates paused." : ""));
    schedule();
  }

  function unreachable(why) {
    status("Cannot read the figures: " + why + "; retrying every 2 s." +
      (lastOK ? " What is shown is from " + clock(lastOK) + "." : ""), true);
    schedule();
  }

  function askToken(err) {
    err = err || fragmentError;
    fragmentError = "";
    $("report").hidden = true;
    $("token-form").hidden = false;
    const e = $("token-error");
    e.textContent = err;
    e.hidden = !err;
    status("This service wants its API token to show the figures.", true);
    $("token").focus();
  }

  function render(r) {
    renderStore(r);
    const box = $("namespaces");
    const open = new Set();
    const cards = [];
    for (const ns of r.namespaces) {
      open.add(ns.name);
      let card = box.querySelector('[data-ns="' + CSS.escape(ns.name) + '"]');
      if (!card) {
        card = newNamespace(ns.name);
        box.append(card);
      }
      fillNamespace(card, ns);
      cards.push([card, ns]);
    }
    for (const card of [...box.children]) {
      if (!open.has(card.dataset.ns)) card.remove();
    }
    // Keep the cards in the order of the report.
    for (const [card] of cards) box.append(card);
    renderTop(r.top_denied);
    fillLookup(r);
    // The charts are drawn once every card is in place: a chart measured
    // while it was the only card would be drawn for the whole row and
    // shrunk to its column. chartSized redraws them as the layout changes.
    for (const [card, ns] of cards) {
      const chart = card.querySelector("svg.chart");
      chartData.set(chart, ns.rate);
      drawChart(chart, ns.rate);
    }
  }

  // chartData holds the rates each chart last drew, for chartSized.
  const chartData = new WeakMap();
  // chartSized redraws a chart whose width changed (a window resized, a
  // scroll bar, a font or a card arriving): it draws in its own pixels.
  const chartSized = typeof ResizeObserver === "function" ? new ResizeObserver((entries) => {
    for (const e of entries) {
      const r = chartData.get(e.target);
      if (r && Math.round(e.contentRect.width) !== Number(e.target.dataset.drawnWidth)) drawChart(e.target, r);
    }
  }) : null;

  function renderStore(r) {
    const s = r.store;
    $("store-kind").textContent = KIND[s.kind] || s.kind || "unknown";
    $("store-name").textContent = s.name;
    const p = $("primary");
    p.replaceChildren();
    if (s.kind === "embedded") {
      p.append(state(true, "up (in this process)"));
    } else if (s.primary_up) {
      p.append(state(true, "up"), s.since ? " since " + when(s.since, r.time) : "");
    } else {
      p.append(state(false, "DOWN, outage in progress"),
        s.since ? " since " + when(s.since, r.time) : "",
        s.error ? el("br") : "", s.error ? "Cause: " + s.error : "");
    }
    if (s.outages) p.append(el("br"), s.outages + (s.outages === 1 ? " outage" : " outages") + " ended since start");
    const o = $("outage");
    if (!s.outage) {
      o.textContent = "no outage: the embedded store cannot be unreachable";
    } else {
      o.replaceChildren(s.primary_up ? "would apply " : el("strong", {}, "in force: "),
        OUTAGE[s.outage] || s.outage);
    }
    const rl = $("reload");
    rl.replaceChildren();
    if (!r.reload) {
      rl.textContent = "no reload since start (SIGHUP reloads --config)";
    } else {
      const ok = r.reload.result === "ok";
      rl.append(el("span", { class: "state " + (ok ? "up" : "refused") }, ok ? "✓ ok" : "⚠ refused"),
        " at " + when(r.reload.at, r.time) + ", " + r.reload.file);
      if (!ok) rl.append(el("br"), "The previous policies stay. Error: " + r.reload.error);
    }
    const up = s.primary_up;
    if (lastPrimary !== null && lastPrimary !== up) {
      $("announce").textContent = up ? "The primary store answers again." :
        "The primary store is down; outage behaviour " + s.outage + " is in force.";
    }
    lastPrimary = up;

    const mb = $("masters-box");
    const masters = s.masters || [];
    mb.hidden = s.kind !== "cluster" && masters.length === 0;
    const rows = masters.map((m) => el("tr", {},
      el("td", {}, m.addr),
      el("td", {}, state(m.up, m.up ? "up" : "DOWN")),
      el("td", {}, m.since ? when(m.since, r.time) : "since start"),
      el("td", {}, m.error || "")));
    $("masters").replaceChildren(...rows);
    const me = $("masters-error");
    me.textContent = s.masters_error ? "Could not list the masters: " + s.masters_error : "";
    me.hidden = !s.masters_error;
  }

  function newNamespace(name) {
    const id = "ns-" + Math.random().toString(36).slice(2);
    const fig = (field, label, cls) => el("div", { class: cls || "" },
      el("dt", {}, label), el("dd", { "data-field": field }));
    const chart = svg("svg", { class: "chart", viewBox: "0 0 320 110", preserveAspectRatio: "xMinYMin meet", role: "img", "aria-labelledby": id + "-t " + id + "-d" });
    const title = svg("title", { id: id + "-t" });
    title.textContent = "Decisions per second in " + name + ", last five minutes";
    const desc = svg("desc", { id: id + "-d" });
    chart.append(title, desc);
    if (chartSized) chartSized.observe(chart);
    const legend = el("span", { class: "legend" },
      el("span", {}, swatch("allowed"), " allowed (solid)"),
      el("span", {}, swatch("denied"), " denied (dashed)"));
    return el("article", { class: "ns", "data-ns": name, "aria-labelledby": id + "-h" },
      el("h3", { id: id + "-h" }, name),
      el("p", { class: "policy", "data-field": "policy" }),
      el("dl", { class: "figures" },
        fig("allowed", "Allowed", "allowed"), fig("denied", "Denied", "denied"), fig("errors", "Errors"),
        fig("rate", "Decisions/s now"), fig("p50", "p50 latency"), fig("p99", "p99 latency")),
      el("figure", {}, chart, el("figcaption", {}, "Decisions per second, last 5 minutes: ", legend)));
  }

  function swatch(kind) {
    const s = svg("svg", { width: "24", height: "8", "aria-hidden": "true" });
    s.append(svg("line", { class: "line " + kind, x1: "0", y1: "4", x2: "24", y2: "4" }));
    return s;
  }

  function fillNamespace(card, ns) {
    const set = (f, v) => { card.querySelector('[data-field="' + f + '"]').textContent = v; };
    const p = ns.policy;
    if (ns.envoy) {
      const n = ns.envoy.rules;
      set("policy", "Envoy domain " + ns.envoy.domain + ", " + n + (n === 1 ? " rule" : " rules") + ", each with its limit");
    } else if (p.plans) {
      set("policy", "Plans " + p.plans.map((pl) => pl.name + " (" + limitWords(pl) + ")").join(", ") +
        "; default " + p.default_plan + (p.trust_plan ? "; a request may name its plan" : ""));
    } else {
      set("policy", limitWords(p));
    }
    set("allowed", num(ns.allowed));
    set("denied", num(ns.denied));
    set("errors", num(ns.errors));
    set("rate", rate(ns.decisions_per_second));
    set("p50", ns.latency.count ? ms(ns.latency.p50_ms) : "none");
    set("p99", ns.latency.count ? ms(ns.latency.p99_ms) : "none");
  }

  function limitWords(p) {
    return p.refill_tokens + " per " + p.refill_period + ", burst " + p.capacity;
  }

  // fillLookup lists the namespaces a subject can be looked up in (the
  // Envoy domains' are not the API's), keeping the one chosen.
  function fillLookup(r) {
    const sel = $("lookup-ns");
    const names = r.namespaces.filter((ns) => !ns.envoy).map((ns) => ns.name);
    if (names.join("\n") === [...sel.options].map((o) => o.value).join("\n")) return;
    const chosen = sel.value;
    sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(chosen)) sel.value = chosen;
  }

  const STANDING = { rate_limit: "Rate limit", token_limit: "Token limit", quota: "Quota" };

  // lookup asks POST /v1/usage for the subject of the form, with the
  // page's token, and shows its plan and standings.
  async function lookup() {
    const out = $("lookup-result");
    const ns = $("lookup-ns").value;
    const subject = $("lookup-subject").value;
    const headers = { Accept: "application/json", "Content-Type": "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    out.replaceChildren(el("p", {}, "Looking up…"));
    let res, body;
    try {
      res = await fetch("v1/usage", { method: "POST", headers, cache: "no-store", credentials: "omit",
        body: JSON.stringify({ namespace: ns, subject }) });
      body = await res.json();
    } catch (e) {
      out.replaceChildren(el("p", { id: "lookup-error", class: "error" }, "The service did not answer."));
      return;
    }
    if (res.status === 401) {
      askToken(t ? "The service refused this token." : "");
      return;
    }
    if (!res.ok) {
      out.replaceChildren(el("p", { id: "lookup-error", class: "error" }, "Refused (" + res.status + "): " + (body.error || "")));
      return;
    }
    const parts = [];
    if (body.plan !== undefined) {
      parts.push(el("p", { class: "plan" }, "Plan: ", el("strong", { id: "lookup-plan" }, body.plan)));
    } else {
      parts.push(el("p", { class: "plan" }, ns + " offers no plans: the namespace's own limits apply."));
    }
    const rows = (body.limits || []).map((s) => el("tr", {},
      el("td", {}, STANDING[s.kind] + (s.kind === "quota" ? " (a " + s.period + " in " + s.time_zone + ", of " + s.counts + ")" : "")),
      el("td", { class: "num" }, num(s.remaining) + " of " + num(s.limit)),
      el("td", { class: "num" }, s.reset_after_ms ? ms(s.reset_after_ms) : "now")));
    parts.push(el("div", { class: "scroll" }, el("table", { id: "lookup-table", "aria-label": "Standing of each limit of " + subject },
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Limit"), el("th", { scope: "col", class: "num" }, "Left"),
        el("th", { scope: "col", class: "num" }, "Full or new window in"))),
      el("tbody", {}, ...rows))));
    out.replaceChildren(...parts);
  }

  // drawChart draws the allowed and denied rates of each step as two lines.
  // It draws in the chart's own pixels (the viewBox follows its width), so
  // that the text keeps its size on any window.
  function drawChart(chart, r) {
    const measured = Math.round(chart.getBoundingClientRect().width);
    const W = Math.max(160, measured || 320);
    const H = 90, left = 40;
    chart.setAttribute("viewBox", "0 0 " + W + " 110");
    chart.dataset.drawnWidth = String(measured);
    const step = r.step_seconds;
    const a = r.allowed.map((n) => n / step);
    const d = r.denied.map((n) => n / step);
    const peak = Math.max(1, ...a, ...d);
    const top = niceCeil(peak);
    const x = (i) => left + (i * (W - 4 - left)) / Math.max(1, a.length - 1);
    const y = (v) => 4 + (H - 4) * (1 - v / top);
    const points = (vs) => vs.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
    for (const e of [...chart.children]) if (e.tagName !== "title" && e.tagName !== "desc") e.remove();
    chart.append(
      svg("line", { class: "axis", x1: left, y1: H, x2: W - 4, y2: H }),
      svg("line", { class: "axis", x1: left, y1: 4, x2: left, y2: H }),
      label(left - 4, 10, "end", fmtRate.format(top) + "/s"),
      label(left - 4, H, "end", "0"),
      label(left, H + 14, "start", "−5 min"),
      label(W - 2, H + 14, "end", "now"),
      svg("polyline", { class: "line allowed", points: points(a) }),
      svg("polyline", { class: "line denied", points: points(d) }));
    const sum = (vs) => vs.reduce((s, v) => s + v, 0);
    chart.querySelector("desc").textContent = "Peak " + rate(Math.max(0, ...a)) + " allowed and " +
      rate(Math.max(0, ...d)) + " denied; " + num(sum(r.allowed)) + " allowed and " + num(sum(r.denied)) +
      " denied over the five minutes.";
  }
  function label(x, y, anchor, text) {
    const t = svg("text", { class: "label", x, y, "text-anchor": anchor });
    t.textContent = text;
    return t;
  }
  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function renderTop(top) {
    const box = $("top");
    if (!top) {
      box.replaceChildren(el("p", { "data-field": "top-hidden" },
        "Not shown: subjects can be personal data. Start the service with --show-top-denied to list the most denied ones."));
      return;
    }
    const caption = el("p", { class: "note" }, "From a fixed sketch of " + top.counters +
      " counters; each denial counts half after " + top.half_life_seconds + " s, so this ranks the last minutes.");
    if (top.subjects.length === 0) {
      box.replaceChildren(caption, el("p", {}, "No denial in the last minutes."));
      return;
    }
    const rows = top.subjects.map((s) => el("tr", {},
      el("td", { class: "subject" }, s.subject),
      el("td", {}, s.namespace),
      el("td", { class: "num" }, num(s.denied) + (s.max_overcount ? " (±" + num(s.max_overcount) + ")" : ""))));
    box.replaceChildren(caption, el("div", { class: "scroll" }, el("table", { id: "top-table", "aria-labelledby": "top-h" },
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Subject"), el("th", { scope: "col" }, "Namespace"),
        el("th", { scope: "col", class: "num" }, "Denials (decayed)"))),
      el("tbody", {}, ...rows))));
  }

  function start() {
    takeFragmentToken();
    $("forget").hidden = !token();
    $("pause").addEventListener("click", () => {
      paused = !paused;
      const b = $("pause");
      b.setAttribute("aria-pressed", String(paused));
      b.textContent = paused ? "Resume updates" : "Pause updates";
      if (paused) {
        clearTimeout(timer);
        status($("status").textContent.replace(/ Updates paused\.$/, "") + " Updates paused.");
      } else {
        refresh();
      }
    });
    $("forget").addEventListener("click", () => {
      setToken("");
      refresh();
    });
    if (!chartSized) {
      let resizing = 0;
      window.addEventListener("resize", () => {
        clearTimeout(resizing);
        resizing = setTimeout(() => { if (lastReport) render(lastReport); }, 150);
      });
    }
    $("lookup-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      lookup();
    });
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = $("token");
      setToken(input.value.trim());
      input.value = "";
      refresh();
    });
    refresh();
  }

  start();
})();

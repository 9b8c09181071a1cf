// The celery-bidding dashboard. Plain JavaScript, no build step, no library: it polls the API
// (GET /aitp/...) every two seconds and draws what it answers.
//
// Two views, chosen by the address's fragment:
//   #                 the auctions as they close, the nodes, assignments per node over time;
//                     with the feed's filters and page in the fragment (the API's own query
//                     parameters: outcome, task_type, node, since, until, contested, before,
//                     limit), any page of every auction in the store
//   #task=ID          one task: each attempt's auction, its bids and score breakdowns, why the
//                     winner won; for a task graph, its steps and each step's auction
// One vocabulary of task states on the page: the bidding states (PENDING, BIDDING, DEFERRED,
// ASSIGNED, EXECUTING, COMPLETED, RETRYING, SUCCESS, FAILED, ESCALATED); a task graph's and a
// step's status (AITP's words) are shown in them (stateOf).
// A read token (bidding_api_read_token) comes from #token=... (kept in this tab's
// sessionStorage, then taken out of the address) or from the form shown on a 401.
"use strict";

(function () {
  const POLL_MS = 2000;
  const TOKEN_KEY = "celery-bidding-read-token";
  // Nodes keep their colour while the page is open: in the chart, the lists and the tables.
  const NODE_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
                        "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f"];
  // Score terms have fixed colours, so a bar reads the same in every auction.
  const TERM_COLORS = {
    confidence: "#4e79a7", skill_match: "#f28e2b", capability: "#59a14f",
    experience: "#b07aa1", load: "#76b7b2", trust: "#edc948", latency: "#ff9da7",
    cost: "#9c755f",
  };
  const OTHER_TERM = "#bab0ac";
  const FINAL = new Set(["COMPLETED", "FAILED"]);
  // The feed's query parameters the fragment may hold, and its page size.
  const FEED_KEYS = ["outcome", "task_type", "node", "since", "until", "contested", "before", "limit"];
  const FILTER_KEYS = ["outcome", "task_type", "node", "since", "until", "contested"];
  const PAGE_SIZE = 25;
  // AITP's words for a task graph's or a step's status, as the page's states: a graph that
  // COMPLETED succeeded; a step CANCELLED never started (an earlier step failed the graph);
  // a step ANNOUNCED is in its auction.
  const AITP_AS_STATE = {COMPLETED: "SUCCESS", CANCELLED: "FAILED", ANNOUNCED: "BIDDING"};
  const nodeColors = new Map();
  let timer = null;
  let shown = "";   // what the current view was drawn from, to redraw only on change

  // --- small helpers ------------------------------------------------------------------------

  // h("td", {class: "x"}, "text", child...): an element; text is always text, never HTML.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "style") el.style.cssText = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
    for (const child of children.flat()) {
      if (child !== null && child !== undefined) el.append(child);
    }
    return el;
  }

  const num = (v, digits = 3) => (v === null || v === undefined ? "-" : Number(v).toFixed(digits));
  const ms = (v) => (v === null || v === undefined ? "-" : `${Number(v).toFixed(1)} ms`);
  const pct = (v) => (v === null || v === undefined ? "-" : `${(100 * v).toFixed(0)}%`);
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], {hour12: false});
  const shortName = (name) => name.split(".").pop();

  function colorOf(node) {
    if (!nodeColors.has(node)) {
      nodeColors.set(node, NODE_PALETTE[nodeColors.size % NODE_PALETTE.length]);
    }
    return nodeColors.get(node);
  }

  function nodeTag(node) {
    return h("span", {class: "node", "data-node": node},
      h("i", {class: "dot", style: `background:${colorOf(node)}`}), node);
  }

  function stateOf(status) {
    return AITP_AS_STATE[status] || status;
  }

  function stateBadge(state, title) {
    return h("span", {class: `state s-${state}`, "data-state": state, title}, state);
  }

  function taskLink(id, text) {
    return h("a", {href: `#task=${encodeURIComponent(id)}`, class: "task-link"}, text);
  }

  // --- the fragment, the token, the API -----------------------------------------------------

  function fragment() {
    return new URLSearchParams(location.hash.replace(/^#/, ""));
  }

  // #token=... goes to sessionStorage and out of the address (so it is not bookmarked or
  // copied along with a link).
  function takeToken() {
    const params = fragment();
    if (!params.has("token")) return;
    sessionStorage.setItem(TOKEN_KEY, params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }

  class NeedsToken extends Error {}

  async function get(path) {
    const headers = {Accept: "application/json"};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    // Relative to the page, so the dashboard also works behind a proxy under a path prefix.
    const answer = await fetch(path.replace(/^\//, ""), {headers, cache: "no-store"});
    if (answer.status === 401) throw new NeedsToken();
    if (!answer.ok) {
      let detail = answer.statusText, problems = null;
      try {
        problems = (await answer.json()).detail;
        detail = JSON.stringify(problems);
      } catch (e) { /* not JSON */ }
      const error = new Error(`${path}: ${answer.status} ${detail}`);
      error.status = answer.status;
      error.problems = problems;
      throw error;
    }
    return answer.json();
  }

  function setStatus(text, kind) {
    const el = document.getElementById("status");
    el.textContent = text;
    el.className = `status ${kind || ""}`;
  }

  function askForToken() {
    const form = document.getElementById("token-form");
    form.hidden = false;
    setStatus(sessionStorage.getItem(TOKEN_KEY) ? "the token was refused" : "needs a read token",
              "bad");
    document.getElementById("main").replaceChildren();
    shown = "";
  }

  // --- scores -------------------------------------------------------------------------------

  // A bid's score as a bar: one segment per positive term, scaled so the bar is as long as the
  // total (a multiplier, such as warm's, scales every segment alike). A negative term is a
  // part of the confidence taken away (slot_share's: a full node's busy slots), so it
  // shortens the confidence segment.
  function scoreBar(bid, scale) {
    const bd = bid.breakdown || {};
    const raw = bd.terms || {};
    const taken = Object.values(raw).reduce((s, v) => s + Math.min(0, v), 0);
    const terms = Object.entries(raw).filter(([, v]) => v > 0).map(([k, v]) =>
      [k, k === "confidence" ? Math.max(0, v + taken) : v]);
    const sum = terms.reduce((s, [, v]) => s + v, 0);
    const total = bid.score || 0;
    const factor = sum > 0 ? total / sum : 0;
    const bar = h("span", {class: "bar", title: breakdownText(bd)});
    for (const [term, value] of terms) {
      const width = (100 * value * factor) / (scale || 1);
      bar.append(h("i", {style: `width:${width}%;background:${TERM_COLORS[term] || OTHER_TERM}`,
                         title: `${term} ${num(value)}`}));
    }
    return bar;
  }

  function breakdownText(bd) {
    if (!bd || Object.keys(bd).length === 0) return "";
    if (bd.eligible === false) return `not eligible: ${bd.reason || ""}`;
    const terms = Object.entries(bd.terms || {}).map(([k, v]) => `${k} ${num(v)}`).join(" + ");
    const mult = Object.entries(bd.multipliers || {}).map(([k, v]) => ` x${num(v, 2)} ${k}`).join("");
    return terms + mult + (bd.reason ? ` (${bd.reason})` : "");
  }

  function termLegend(auctions) {
    const seen = new Set();
    for (const a of auctions) {
      // Only the terms a bar draws (a negative one shortens confidence's segment instead).
      for (const b of a.bids) {
        for (const [t, v] of Object.entries((b.breakdown || {}).terms || {})) if (v > 0) seen.add(t);
      }
    }
    return h("p", {class: "legend"}, "Score bars: ",
      [...seen].sort().map((t) => h("span", {class: "term"},
        h("i", {class: "swatch", style: `background:${TERM_COLORS[t] || OTHER_TERM}`}), t)),
      h("span", {class: "term"}, h("b", {}, "\u2605"), " winner"),
      h("span", {class: "term muted"}, "grey: refused, not eligible or late"));
  }

  // One answer of an auction, in the live list.
  function bidChip(bid, scale) {
    const eligible = bid.will_bid && !bid.late && (bid.breakdown || {}).eligible !== false;
    const classes = ["bid", bid.is_winner ? "winner" : "", eligible ? "" : "out"].join(" ");
    let tail;
    if (!bid.will_bid) tail = h("span", {class: "why-out"}, `refused: ${bid.reason}`);
    else if (bid.late) tail = h("span", {class: "why-out"}, "late");
    else if (!eligible) tail = h("span", {class: "why-out"}, `not eligible: ${(bid.breakdown || {}).reason || ""}`);
    else tail = [h("b", {class: "score"}, num(bid.score)), scoreBar(bid, scale)];
    return h("li", {class: classes, "data-node": bid.node, "data-score": bid.score ?? ""},
      bid.is_winner ? h("b", {class: "star", title: "winner"}, "\u2605") : null,
      nodeTag(bid.node), tail);
  }

  function sortedBids(bids) {
    return [...bids].sort((a, b) => (b.is_winner - a.is_winner) || ((b.score ?? -1) - (a.score ?? -1))
      || a.node.localeCompare(b.node));
  }

  // --- the home view ------------------------------------------------------------------------

  function auctionCard(a) {
    const scale = Math.max(1, ...a.bids.map((b) => b.score || 0));
    const label = shortName(a.task_name) + (a.attempt > 1 ? ` #${a.attempt}` : "");
    const outcome = a.winner
      ? h("span", {class: "outcome"}, "\u2192 ", nodeTag(a.winner), " ",
          h("b", {}, num(a.winning_score)),
          a.outcome === "fallback" ? " (fallback)" : "",
          h("span", {class: "muted"}, ` in ${ms(a.assignment_ms)}`))
      : h("span", {class: "outcome bad"}, `no award: ${a.error || ""}`);
    return h("article", {class: "auction", "data-task": a.task_id, "data-attempt": a.attempt,
                          "data-winner": a.winner || ""},
      h("div", {class: "line"},
        h("span", {class: "time"}, clock(a.closed_at)),
        taskLink(a.task_id, label),
        h("span", {class: "muted", title: "strategy"}, a.strategy),
        a.graph_id ? h("span", {class: "muted"}, "step ", taskLink(a.graph_id, a.step_id), " of a graph") : null,
        outcome,
        stateBadge(a.state, "the task's state now")),
      h("ul", {class: "bids"}, sortedBids(a.bids).map((b) => bidChip(b, scale))),
      a.why.length ? h("p", {class: "why"}, "why: ", a.why[0]) : null);
  }

  // What a node declares, as free/declared (its unfinished attempts reserve the rest), and
  // the items it holds warm: nothing when it declares neither.
  function resourcesLine(n) {
    const declared = Object.keys(n.resources || {}).sort();
    if (!declared.length && !(n.warm || []).length) return null;
    const amount = (v) => String(Math.round(Number(v || 0) * 100) / 100);
    const held = declared.map((k) => `${k} ${amount((n.free || {})[k])}/${amount(n.resources[k])}`);
    return h("div", {class: "skills", "data-resources": declared.join(" "),
                     title: "resources free of declared; warm items"},
      held.join(", "), (n.warm || []).length ? h("span", {class: "muted"}, ` warm: ${n.warm.join(", ")}`) : null);
  }

  function nodesTable(nodes) {
    const rows = nodes.map((n) => h("tr", {"data-node": n.name},
      h("td", {}, nodeTag(n.name), h("div", {class: "skills"}, n.capabilities.join(", ")),
        resourcesLine(n)),
      h("td", {class: n.live ? "good nowrap" : "bad nowrap"}, n.live ? "\u25cf live" : `\u25cb ${n.status}`),
      h("td", {}, h("span", {class: "meter", title: `${n.in_flight} in flight of capacity ${n.capacity}`},
        h("i", {style: `width:${Math.min(100, 100 * n.load)}%`})), ` ${n.in_flight}/${n.capacity}`),
      h("td", {class: "num", title: "declared in its profile \u2192 learned from its outcomes"},
        `${num(n.trust, 0)} \u2192 ${num(n.learned_trust, 1)}`),
      h("td", {class: "num"}, n.tasks_won),
      h("td", {class: "num"}, pct(n.success_rate), h("span", {class: "muted"}, ` (${n.successes}/${n.attempts})`))));
    return h("table", {class: "nodes"},
      h("thead", {}, h("tr", {}, ["node and skills", "now", "load", "trust", "won", "success"]
        .map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: 6, class: "muted"}, "no node has heartbeaten yet"))));
  }

  // Assignments per node over time: stacked bars, one colour per node.
  function chart(tl) {
    const W = 640, H = 200, left = 34, bottom = 22, top = 8;
    const totals = tl.buckets.map((b) => Object.values(b.counts).reduce((s, v) => s + v, 0));
    const peak = Math.max(1, ...totals);
    const slot = (W - left) / tl.buckets.length;
    const y = (v) => top + (H - top - bottom) * (1 - v / peak);
    const parts = [];
    parts.push(svg("line", {x1: left, y1: y(0), x2: W, y2: y(0), class: "axis"}));
    for (const tick of new Set([0, Math.ceil(peak / 2), peak])) {
      parts.push(svg("text", {x: left - 4, y: y(tick) + 4, class: "tick", "text-anchor": "end"}, String(tick)));
    }
    tl.buckets.forEach((b, i) => {
      let base = 0;
      for (const node of tl.nodes) {
        const count = b.counts[node] || 0;
        if (!count) continue;
        const rect = svg("rect", {x: left + i * slot + 1, width: Math.max(1, slot - 2),
          y: y(base + count), height: y(base) - y(base + count), fill: colorOf(node)});
        rect.append(svg("title", {}, `${node}: ${count} at ${clock(b.start)}`));
        parts.push(rect);
        base += count;
      }
    });
    if (tl.buckets.length) {
      parts.push(svg("text", {x: left, y: H - 6, class: "tick"}, clock(tl.since)));
      parts.push(svg("text", {x: W, y: H - 6, class: "tick", "text-anchor": "end"}, clock(tl.until)));
      parts.push(svg("text", {x: (left + W) / 2, y: H - 6, class: "tick", "text-anchor": "middle"},
        tl.bucket_seconds < 1 ? `${Math.round(tl.bucket_seconds * 1000)} ms a bar`
          : `${num(tl.bucket_seconds, tl.bucket_seconds < 10 ? 1 : 0)} s a bar`));
    }
    return h("figure", {class: "chart"},
      svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "assignments per node over time"}, parts),
      h("figcaption", {}, tl.nodes.length ? tl.nodes.map((n) => nodeTag(n)) : "no assignment yet"));
  }

  function totalsLine(stats) {
    const el = document.getElementById("totals");
    el.replaceChildren(
      h("span", {}, h("b", {}, stats.announced), " announced"),
      h("span", {}, h("b", {}, stats.succeeded), " succeeded"),
      h("span", {}, h("b", {}, stats.failed), " failed"),
      h("span", {}, h("b", {}, stats.unfinished), " unfinished"),
      h("span", {}, "success ", h("b", {}, pct(stats.success_rate))),
      h("span", {}, "assignment p50 ", h("b", {}, ms(stats.assignment_p50_ms)),
        " p99 ", h("b", {}, ms(stats.assignment_p99_ms))));
  }

  // --- the feed's filters and pages ---------------------------------------------------------

  // The API query of the feed the fragment asks for (its page size unless it says one).
  function feedQuery(params) {
    const query = new URLSearchParams();
    for (const key of FEED_KEYS) {
      const value = params.get(key);
      if (value !== null && value !== "") query.set(key, value);
    }
    if (!query.has("limit")) query.set("limit", String(PAGE_SIZE));
    return query;
  }

  // The address of the home view with ``changes`` (a null value takes the key out).
  function linkTo(params, changes) {
    const next = new URLSearchParams();
    for (const key of FEED_KEYS) if (params.get(key)) next.set(key, params.get(key));
    for (const [key, value] of Object.entries(changes)) {
      if (value === null || value === undefined || value === "") next.delete(key);
      else next.set(key, String(value));
    }
    return `#${next.toString()}`;
  }

  // Unix seconds <-> a datetime-local field's value (the browser's time zone).
  function toLocalInput(seconds) {
    if (!seconds || Number.isNaN(Number(seconds))) return "";
    const d = new Date(Number(seconds) * 1000);
    return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
  }
  const fromLocalInput = (value) => (value ? String(new Date(value).getTime() / 1000) : "");

  function field(name) {
    return document.getElementById(`f-${name}`);
  }

  // The form shows what the fragment asks for (on load and on every change of address).
  function fillFilters(params) {
    field("outcome").value = params.get("outcome") || "";
    field("task_type").value = params.get("task_type") || "";
    const node = params.get("node") || "";
    if (node && ![...field("node").options].some((o) => o.value === node)) {
      field("node").append(h("option", {value: node}, node));
    }
    field("node").value = node;
    field("since").value = toLocalInput(params.get("since"));
    field("until").value = toLocalInput(params.get("until"));
    field("contested").checked = ["1", "true"].includes(params.get("contested") || "");
  }

  // The choices the form offers: the nodes and task types the store knows.
  function offerChoices(nodes, stats) {
    const select = field("node");
    const names = nodes.map((n) => n.name).sort();
    const offered = [...select.options].map((o) => o.value).filter(Boolean);
    if (names.some((n) => !offered.includes(n))) {
      const chosen = select.value;
      select.replaceChildren(h("option", {value: ""}, "any"),
        [...new Set([...names, ...offered])].sort().map((n) => h("option", {value: n}, n)));
      select.value = chosen;
    }
    document.getElementById("task-types").replaceChildren(
      ...(stats.task_types || []).map((t) => h("option", {value: t.task_type})));
  }

  function applyFilters(e) {
    e.preventDefault();
    const params = fragment();
    const changes = {before: null, outcome: field("outcome").value,
      task_type: field("task_type").value.trim(), node: field("node").value,
      since: fromLocalInput(field("since").value), until: fromLocalInput(field("until").value),
      contested: field("contested").checked ? "true" : null};
    location.hash = linkTo(params, changes);
  }

  function pager(params, feed) {
    const more = feed.older !== null && feed.older !== undefined;
    return h("nav", {class: "pager"},
      params.get("before") ? h("a", {id: "newest", href: linkTo(params, {before: null})}, "\u2190 newest") : null,
      more ? h("a", {id: "older", href: linkTo(params, {before: feed.older})}, "older \u2192")
        : h("span", {class: "muted", id: "no-older"}, feed.auctions.length ? "no older auction matches" : ""));
  }

  // What the filters in force are, in words (the form's fields say it too).
  function activeFilters(params) {
    const said = [];
    const stamp = (t) => new Date(Number(t) * 1000).toLocaleString([], {hour12: false});
    if (params.get("outcome")) said.push(`outcome ${params.get("outcome")}`);
    if (params.get("task_type")) said.push(`task type ${params.get("task_type")}`);
    if (params.get("node")) said.push(`node ${params.get("node")}`);
    if (params.get("since")) said.push(`closed from ${stamp(params.get("since"))}`);
    if (params.get("until")) said.push(`closed before ${stamp(params.get("until"))}`);
    if (["1", "true"].includes(params.get("contested") || "")) said.push("contested only");
    return said.length ? h("p", {class: "help", id: "active-filters"}, "Only: ", said.join(" \u00b7 "),
      " (", h("a", {href: "#"}, "clear"), ")") : null;
  }

  function filterProblem(problems) {
    const lines = Array.isArray(problems) ? problems.map((p) => `${(p.loc || []).slice(-1)[0]}: ${p.msg}`)
      : [String(problems)];
    return h("p", {class: "bad", id: "filter-error"}, "These filters cannot be used: ", lines.join("; "));
  }

  // --- the home view, continued ---------------------------------------------------------------

  async function drawHome() {
    const params = fragment();
    const query = feedQuery(params);
    const [feed, nodes, timeline, stats] = await Promise.all([
      get(`/aitp/auctions?${query}`).catch((e) => {
        if (e.status === 422) return {problems: e.problems};
        throw e;
      }),
      get("/aitp/nodes"), get("/aitp/timeline?buckets=40"), get("/aitp/stats?protocol=false")]);
    totalsLine(stats);
    offerChoices(nodes, stats);
    const key = JSON.stringify([query.toString(), feed.cursor, feed.older, feed.problems,
      (feed.auctions || []).map((a) => a.state), nodes, timeline.buckets, timeline.nodes]);
    if (key === shown) return;
    shown = key;
    for (const n of [...timeline.nodes, ...nodes.map((n) => n.name)].sort()) colorOf(n);
    const filtered = FILTER_KEYS.some((k) => params.get(k));
    let list;
    if (feed.problems) {
      list = [filterProblem(feed.problems)];
    } else {
      const auctions = feed.auctions;
      list = [termLegend(auctions),
        auctions.length ? auctions.map(auctionCard) : h("p", {class: "muted"}, filtered
          ? "No auction matches these filters."
          : "No auction has closed yet: submit a task (POST /aitp/tasks, or .delay() in your app)."),
        pager(params, feed)];
    }
    document.getElementById("main").replaceChildren(
      h("div", {class: "columns"},
        h("section", {class: "feed", id: "auctions"},
          h("h2", {}, params.get("before") ? "Older auctions " : "Auctions as they close ",
            h("span", {class: "muted"}, filtered ? "(newest first, filtered)" : "(newest first)")),
          h("p", {class: "help"}, "Each line: the task (open it for every bid's score breakdown), ",
            "its strategy, the winner with its score and the time from announcement to award; ",
            "below it, every node that answered, its score and what made it up. ",
            "The filters above and \u201colder\u201d below page back through every auction in the store."),
          activeFilters(params),
          list),
        h("section", {class: "side"},
          h("h2", {}, "Nodes"), nodesTable(nodes),
          h("h2", {}, "Assignments per node"), chart(timeline),
          openBox())));
  }

  function openBox() {
    const input = h("input", {type: "text", placeholder: "task or task graph id", "aria-label": "task id"});
    const form = h("form", {class: "open"}, input, h("button", {type: "submit"}, "Open task"));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (input.value.trim()) location.hash = `task=${encodeURIComponent(input.value.trim())}`;
    });
    return form;
  }

  // --- the task view ------------------------------------------------------------------------

  // Attempt n's bids (each attempt is an auction of its own).
  function bidsTable(ex, n) {
    const bids = sortedBids(ex.bids.filter((b) => b.attempt === n));
    const scale = Math.max(1, ...bids.map((b) => b.score || 0));
    const rows = bids.map((b) => {
      const eligible = b.will_bid && !b.late && (b.breakdown || {}).eligible !== false;
      const detail = !b.will_bid ? `refused: ${b.reason}` : b.late ? "late (after the close)"
        : breakdownText(b.breakdown);
      return h("tr", {class: `${b.is_winner ? "winner" : ""} ${eligible ? "" : "out"}`, "data-node": b.node},
        h("td", {}, b.is_winner ? h("b", {class: "star"}, "\u2605 ") : null, nodeTag(b.node)),
        h("td", {class: "num score"}, num(b.score)),
        h("td", {}, eligible ? scoreBar(b, scale) : null, h("div", {class: "breakdown"}, detail),
          // A node's own bidder (issue 14) says who judged the task, and why it bid so.
          b.bidder ? h("div", {class: "breakdown"}, `bidder ${b.bidder}`,
            b.reasoning ? `: ${b.reasoning}` : "") : null),
        ["capability", "experience", "load", "confidence"].map((k) => h("td", {class: "num"}, num(b[k], 2))),
        h("td", {class: "num"}, num(b.cost, 4)),
        h("td", {class: "num"}, num(b.latency_ms, 0)),
        h("td", {class: "num"}, num(b.trust, 0)),
        h("td", {class: "num"}, ms(b.answered_after_ms)));
    });
    return h("table", {class: "bids-table"},
      h("thead", {}, h("tr", {}, ["node", "score", "how it scored", "capability", "experience",
        "load", "confidence", "cost", "latency", "trust", "answered after"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: 11, class: "muted"}, "no answer yet"))));
  }

  function verdict(ex) {
    const title = ex.winner
      ? h("p", {class: "winner-line"}, "Winner: ", nodeTag(ex.winner), " with score ",
          h("b", {class: "score"}, num(ex.winning_score)),
          h("span", {class: "muted"}, ` (${ex.outcome}, closed by ${ex.closed_by || "-"}, ${ms(ex.assignment_ms)} after the announcement)`))
      : h("p", {class: "winner-line bad"}, ex.error ? `No winner: ${ex.error}` : `No winner yet (${ex.state})`);
    return h("div", {class: "verdict"}, title,
      h("ul", {class: "why-list"}, ex.why.map((w) => h("li", {}, w))));
  }

  // 0-9, higher is more urgent; the named levels as the API takes them.
  const PRIORITY_NAMES = {8: "high", 5: "normal", 2: "low"};
  function priorityLabel(p) {
    return p in PRIORITY_NAMES ? `${p} (${PRIORITY_NAMES[p]})` : String(p);
  }

  // Every attempt the task had, oldest first: the attempts the log, the bids and the task
  // itself name.
  function attemptNumbers(ex) {
    const seen = new Set([ex.attempt, ...ex.attempts.map((a) => a.attempt),
      ...ex.bids.map((b) => b.attempt), ...ex.messages.map((m) => m.attempt)]);
    return [...seen].filter((n) => n >= 1).sort((a, b) => a - b);
  }

  // How an earlier attempt's auction closed, from its own messages: its winner and score
  // (and any re-award), or why none won.
  function pastVerdict(ex, n) {
    const mine = ex.messages.filter((m) => m.attempt === n);
    const award = mine.find((m) => m.kind === "AWARDED");
    const none = mine.find((m) => m.kind === "NO_AWARD");
    const moved = mine.filter((m) => m.kind === "REAWARDED" && m.node);
    const summary = ex.attempts.find((a) => a.attempt === n);
    const line = award
      ? h("p", {class: "winner-line"}, "Winner: ", nodeTag(award.node), " with score ",
          h("b", {class: "score"}, num(award.detail.score)),
          moved.length ? [" \u2192 re-awarded to ", moved.map((m) => nodeTag(m.node))] : null)
      : h("p", {class: "winner-line bad"}, none ? `No winner: ${none.detail.error || ""}` : "No award recorded");
    return h("div", {class: "verdict past"}, line,
      summary ? h("p", {class: "muted"}, `then: ${summary.outcome}`,
        summary.error ? `: ${summary.error}` : "", summary.then ? `; ${summary.then}` : "") : null);
  }

  // Each attempt's auction: the current one with why its winner won, the earlier ones with
  // their winner; each with its bids.
  function attemptSections(ex) {
    const numbers = attemptNumbers(ex);
    return numbers.reverse().map((n) => h("article", {class: "attempt", "data-attempt": n},
      numbers.length > 1 ? h("h4", {}, `Attempt ${n}`, n === ex.attempt ? " (the latest)" : "") : null,
      n === ex.attempt ? verdict(ex) : pastVerdict(ex, n),
      bidsTable(ex, n)));
  }

  function auctionSection(ex, heading) {
    const attempts = ex.attempts.length > 1
      ? h("div", {}, h("h3", {}, "Attempts"), h("ol", {class: "attempts"}, ex.attempts.map((a) =>
          h("li", {value: a.attempt}, `${a.nodes.join(" \u2192 ") || "-"}: ${a.outcome}`,
            a.error ? `: ${a.error}` : "", a.then ? `; ${a.then}` : ""))))
      : null;
    return h("section", {class: "auction-detail", "data-task": ex.task_id},
      heading,
      h("p", {class: "facts"},
        h("span", {}, "strategy ", h("b", {}, ex.strategy)),
        h("span", {}, "priority ", h("b", {}, priorityLabel(ex.priority))),
        h("span", {}, "required skills ", h("b", {}, ex.required_skills.join(", ") || "-")),
        h("span", {}, "preferred node ", h("b", {}, ex.preferred_node || "-")),
        h("span", {}, "candidates ", ex.candidates.length
          ? ex.candidates.flatMap((c, i) => (i ? [", ", nodeTag(c)] : [nodeTag(c)])) : "-"),
        h("span", {}, "state ", stateBadge(ex.state)),
        ex.attempt > 1 ? h("span", {}, "attempt ", h("b", {}, ex.attempt)) : null),
      attemptSections(ex),
      attempts,
      h("details", {}, h("summary", {}, `Message log (${ex.messages.length})`),
        h("ol", {class: "log"}, ex.messages.map((m) => h("li", {},
          h("span", {class: "time"}, clock(m.at)), ` ${m.kind}`, m.node ? ` ${m.node}` : "",
          m.attempt > 1 ? ` #${m.attempt}` : "",
          Object.keys(m.detail).length ? h("code", {}, ` ${JSON.stringify(m.detail)}`) : null)))));
  }

  function stepsTable(steps, auctions) {
    return h("table", {class: "steps"},
      h("thead", {}, h("tr", {}, ["step", "name", "capability", "status", "node", "score", "cost", "took"]
        .map((c) => h("th", {}, c)))),
      h("tbody", {}, steps.map((s) => {
        const ex = auctions[s.step_id];
        return h("tr", {"data-step": s.step_id},
          h("td", {}, ex ? taskLink(s.task_id, s.step_id) : s.step_id),
          h("td", {}, s.name), h("td", {}, s.agent_capability),
          h("td", {}, ex ? stateBadge(ex.state)
            : stateBadge(stateOf(s.status), s.status === "CANCELLED" ? "never started: an earlier step failed" : null)),
          h("td", {}, s.agent_id ? nodeTag(s.agent_id) : "-"),
          h("td", {class: "num"}, num(ex ? ex.winning_score : null)),
          h("td", {class: "num"}, num(s.cost, 4)),
          h("td", {class: "num"}, s.started_at && s.completed_at ? `${(s.completed_at - s.started_at).toFixed(2)} s` : "-"));
      })));
  }

  async function result(id, status) {
    if (!FINAL.has(status)) return null;
    const r = await get(`/aitp/tasks/${encodeURIComponent(id)}/result`);
    return h("div", {class: "result"}, h("h3", {}, "Result"),
      r.error ? h("p", {class: "bad"}, r.error) : h("pre", {}, JSON.stringify(r.result, null, 2)),
      h("p", {class: "muted"}, `cost ${num(r.cost, 4)}, ${r.execution_time_ms === null ? "-" : ms(r.execution_time_ms)}`));
  }

  async function drawTask(id) {
    const path = `/aitp/tasks/${encodeURIComponent(id)}`;
    let state, bids;
    try {
      [state, bids] = await Promise.all([get(path), get(`${path}/bids`)]);
    } catch (e) {
      if (e.status === 404) {
        shown = "";
        document.getElementById("main").replaceChildren(back(),
          h("p", {class: "bad"}, `No task ${id} in the store.`));
        return;
      }
      throw e;
    }
    const key = JSON.stringify([state, bids]);
    if (key === shown) return;
    shown = key;
    const graph = Array.isArray(state.progress.steps);
    const head = h("div", {class: "task-head"},
      h("h2", {}, graph ? "Task graph " : "Task ", h("code", {}, id)),
      h("p", {class: "facts"},
        h("span", {}, "state ", stateBadge(graph ? stateOf(state.status) : state.state)),
        graph ? h("span", {}, `step ${state.current_step} of ${state.progress.total_steps}, `,
          `${state.progress.percent_complete}% done`) : null,
        h("span", {}, `cost so far ${num(state.cost_so_far, 4)}`)));
    const body = [back(), head];
    if (graph) {
      body.push(h("h3", {}, "Steps"), stepsTable(state.progress.steps, bids.subtasks));
      for (const s of state.progress.steps) {
        const ex = bids.subtasks[s.step_id];
        if (ex) body.push(auctionSection(ex, h("h3", {}, `Auction of ${s.step_id}: ${s.name} `, taskLink(s.task_id, "(open)"))));
      }
    } else {
      body.push(auctionSection(bids, h("h3", {}, "Auction of ",
        h("span", {title: bids.task_name}, shortName(bids.task_name)), h("span", {class: "muted"}, ` (${bids.task_type})`))));
    }
    body.push(await result(id, state.status));
    document.getElementById("main").replaceChildren(...body.filter(Boolean));
  }

  function back() {
    return h("p", {class: "back"}, h("a", {href: "#"}, "\u2190 all auctions and nodes"));
  }

  // --- the loop -----------------------------------------------------------------------------

  async function tick() {
    clearTimeout(timer);
    const id = fragment().get("task");
    document.getElementById("filters").hidden = Boolean(id);
    try {
      if (id) await drawTask(id); else await drawHome();
      document.getElementById("token-form").hidden = true;
      setStatus(`live \u00b7 updated ${clock(Date.now() / 1000)}`, "good");
    } catch (e) {
      if (e instanceof NeedsToken) {   // no polling until a token
        document.getElementById("filters").hidden = true;
        askForToken();
        return;
      }
      setStatus(`cannot read the API: ${e.message}`, "bad");
    }
    timer = setTimeout(tick, POLL_MS);
  }

  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    tick();
  });
  document.getElementById("filters").addEventListener("submit", applyFilters);
  window.addEventListener("hashchange", () => {
    takeToken(); fillFilters(fragment()); shown = ""; tick();
  });
  takeToken();
  fillFilters(fragment());
  tick();
})();

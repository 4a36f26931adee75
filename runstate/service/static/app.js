// The audit pages of `runstate serve` (/ui): plain modules over the JSON API, no build step.
// Every value from the server is put in the page as text (el() makes text nodes), never as
// HTML: a goal holding <script> shows those characters.

const main = document.getElementById("main");
const PAGE_RUNS = 50;
const PAGE_PATCHES = 100;

// --- the API ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message, extra = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.extra = extra;
  }
}

function token() {
  return sessionStorage.getItem("runstate-token");
}

async function api(path, { raw = false } = {}) {
  const headers = {};
  if (token()) headers.authorization = `Bearer ${token()}`;
  let resp = await fetch(path, { headers });
  // An instance that sheds load (429) or moves a partition (503) says when to come back.
  for (let tries = 0; (resp.status === 429 || resp.status === 503) && tries < 5; tries++) {
    const after = Math.min(2, Number(resp.headers.get("retry-after")) || 1);
    await new Promise((done) => setTimeout(done, after * 1000 * (0.5 + Math.random() / 2)));
    resp = await fetch(path, { headers });
  }
  if (!resp.ok) {
    let code = `http_${resp.status}`;
    let message = resp.statusText;
    let extra = {};
    try {
      const body = await resp.json();
      code = body.error.code;
      message = body.error.message;
      extra = body.error;
    } catch (_) { /* not runstate's error body */ }
    throw new ApiError(resp.status, code, message, extra);
  }
  return raw ? resp : resp.json();
}

// --- building the page ---------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function show(...nodes) {
  main.replaceChildren(...nodes);
}

function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return isNaN(d) ? String(iso) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// A run id as one path segment (as runstate.client does): "/" and "?" escaped, and "." and
// ".." too, which the browser would otherwise resolve as dot segments to another path.
function seg(id) {
  const q = encodeURIComponent(id);
  return q === "." || q === ".." ? q.replace(/\./g, "%2E") : q;
}

function runLink(runId) {
  return `/ui/runs/${seg(runId)}`;
}

function failure(e, what) {
  if (e instanceof ApiError && e.status === 401) return askForToken(e.message);
  if (e instanceof ApiError && e.status === 410) {
    // An erased run: nothing of it is left but who erased it, when and why.
    const er = e.extra.erasure || {};
    document.title = "erased · runstate";
    return show(el("h1", {}, `${what}: erased`),
                el("dl", { class: "erasure" },
                   el("dt", {}, "Erased at"), el("dd", {}, when(er.at)),
                   el("dt", {}, "By"), el("dd", {}, er.by || ""),
                   el("dt", {}, "Why"), el("dd", {}, er.reason || "")),
                el("p", { class: "muted" }, "Its content is gone from the log's copies, the projections and the checkpoints."),
                el("p", {}, el("a", { href: "/ui" }, "Back to the runs")));
  }
  if (e instanceof ApiError && e.status === 404) {
    document.title = "not found · runstate";
    return show(el("h1", {}, `${what}: not found`), el("p", {}, e.message),
                el("p", {}, el("a", { href: "/ui" }, "Back to the runs")));
  }
  const detail = e instanceof ApiError ? `${e.status} ${e.code}: ${e.message}` : String(e);
  show(el("h1", {}, what), el("div", { class: "error", role: "alert" }, detail),
       el("p", {}, el("a", { href: "/ui" }, "Back to the runs")));
}

function askForToken(why) {
  document.title = "token · runstate";
  const input = el("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const form = el("form", {
    onsubmit: (ev) => {
      ev.preventDefault();
      sessionStorage.setItem("runstate-token", input.value.trim());
      location.reload();
    },
  }, el("label", { for: "token" }, "Bearer token "), input, " ", el("button", { type: "submit" }, "Continue"));
  const how = el("p", {}, "Ask the operator of this server for one: ",
    el("code", {}, "runstate token add YOUR_NAME --read-only --tokens-file FILE"),
    " prints it once. It is kept in this tab only (session storage) and sent as ", el("code", {}, "Authorization: Bearer"), ".");
  show(el("h1", {}, "This server needs a token"), el("p", { class: "muted" }, why), how, form);
  input.focus();
}

// --- /ui: the runs -----------------------------------------------------------------------------

async function runsPage() {
  document.title = "runs · runstate";
  const params = new URLSearchParams(location.search);
  const q = params.get("q") || "";
  const status = params.get("status") || "";
  // The runs that moved last first: what a person looking at a platform asks about.
  const order = params.get("order") === "id" ? "id" : "recent";
  const after = params.get("after") || "";
  const query = new URLSearchParams({ limit: PAGE_RUNS, order });
  if (q) query.set("q", q);
  if (status) query.set("status", status);
  if (after) query.set("after", after);
  let resp;
  try {
    resp = await api(`/runs?${query}`, { raw: true });
  } catch (e) {
    return failure(e, "Runs");
  }
  const runs = await resp.json();
  const total = Number(resp.headers.get("x-total-count") || runs.length);
  const nextAfter = resp.headers.get("x-next-after");
  const search = el("input", { id: "q", name: "q", type: "search", value: q, placeholder: "part of a run id" });
  const pick = el("select", { id: "status", name: "status" },
    ["", "running", "waiting", "completed", "failed", "cancelled"].map((s) =>
      el("option", { value: s, selected: s === status }, s || "any")));
  const sort = el("select", { id: "order", name: "order" },
    [["recent", "latest activity"], ["id", "run id"]].map(([v, label]) =>
      el("option", { value: v, selected: v === order }, label)));
  const form = el("form", { class: "controls", role: "search", method: "get", action: "/ui" },
    el("label", { for: "q" }, "Run id", search), el("label", { for: "status" }, "Status", pick),
    el("label", { for: "order" }, "Sorted by", sort),
    el("button", { type: "submit" }, "Filter"));
  // A run is known by what it is for: its goal beside its id. An erased run has none left,
  // and its last patch was the operator's erasure, not an agent's version.
  const rows = runs.map((r) => el("tr", {},
    el("td", {}, el("a", { href: runLink(r.run_id), class: "mono" }, r.run_id)),
    el("td", { class: "goal" }, r.status === "erased" ? "" : (r.goal?.statement ?? "")),
    el("td", {}, r.status), el("td", {}, r.phase ?? ""), el("td", {}, String(r.revision)),
    el("td", {}, when(r.updated_at)), el("td", {}, r.created_by ?? ""),
    el("td", { class: "agent-version" }, r.status === "erased" ? "" : r.agent_version)));
  // The service says where the next page starts, and only when this one is full.
  const next = new URLSearchParams(params);
  if (nextAfter) next.set("after", nextAfter);
  const first = new URLSearchParams(params);
  first.delete("after");
  const pager = el("div", { class: "pager" },
    after ? el("a", { href: `/ui${first.size ? `?${first}` : ""}` }, "First page") : null,
    nextAfter ? el("a", { href: `/ui?${next}`, rel: "next" }, "Next page") : null);
  show(
    el("h1", {}, "Runs"),
    form,
    el("p", { class: "muted", id: "count" }, `${total} run${total === 1 ? "" : "s"}${after ? ", a later page" : ""}`),
    el("table", { id: "runs" },
      el("thead", {}, el("tr", {}, ["run", "goal", "status", "phase", "revision", "last change", "started by", "agent version"].map((h) =>
        el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows)),
    pager,
  );
}

// --- /ui/runs/{id}: one run ------------------------------------------------------------------

// The items of each collection, what names an item, and how it is shown.
const SECTIONS = [
  ["confirmed_facts", "Facts", "id", (f) => [["statement", f.statement], f.evidence && ` (evidence ${f.evidence})`,
    f.source && ` (source ${f.source})`, f.provenance && ` — ${f.provenance.created_by.agent_id}, r${f.confirmed_at_revision}`]],
  ["hypotheses", "Hypotheses (not facts)", "id", (h) => [h.statement, " — confidence ", ["confidence", String(h.confidence)],
    `; falsified by: ${h.falsifier}`]],
  ["tasks", "Tasks", "id", (t) => [t.title, " — ", ["status", t.status], t.owner && ` (owner ${t.owner})`,
    t.blocked_by && ` blocked by ${t.blocked_by}`]],
  ["open_questions", "Open questions", "id", (q) => [q.text]],
  ["environment_observations", "Observations", "subject", (o, state) => [["observed_state", o.observed_state],
    o.observed_version && ` (version ${o.observed_version})`, ` at ${when(o.observed_at)}`,
    stale(o, state) && el("span", { class: "tag bad" }, "STALE")]],
  ["effect_ledger", "Effects", "id", (e) => [["status", e.status], e.kind && ` ${e.kind}`, e.target && ` on ${e.target}`,
    e.idempotency_key && ` (key ${e.idempotency_key})`]],
  ["pending_tool_calls", "Calls in flight", "call_id", (c) => [c.tool, c.side_effect && " (side effect)", ` since ${when(c.started_at)}`]],
  ["artifacts", "Artifacts", "id", (a) => [a.kind, a.digest && ` ${a.digest}`]],
  ["inputs", "Inputs", "id", (i) => [`${i.origin}: `, i.text ?? ""]],
];

function stale(o, state) {
  const max = state.policy && state.policy.observation_max_age_s;
  return max && (Date.now() - new Date(o.observed_at).getTime()) / 1000 > max;
}

function paths(value, prefix, out = new Map()) {
  // Leaves of a state document by dotted path (list items by their id, as explain names them).
  if (Array.isArray(value)) {
    if (value.length && typeof value[0] === "object" && value[0] !== null) {
      for (const item of value) {
        const id = item.id ?? item.key ?? item.subject ?? item.call_id;
        paths(item, `${prefix}.${id}`, out);
      }
      return out;
    }
    out.set(prefix, JSON.stringify(value));
    return out;
  }
  if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) paths(v, prefix ? `${prefix}.${k}` : k, out);
    return out;
  }
  out.set(prefix, JSON.stringify(value));
  return out;
}

// What every patch changes (the revision, when, by which version, the last transition) and
// the projector's own bookkeeping: true, but not what a person calls the change.
const BOOKKEEPING_TOP = new Set(["revision", "updated_at", "agent_version", "last_transition", "last_control_revision",
                                 "schema_version", "effect_ledger_ref"]);
const BOOKKEEPING_LEAF = new Set(["updated_at", "updated_at_revision", "registered_at_revision", "started_at_revision"]);

function changedPaths(before, after) {
  const a = paths(before || {}, "");
  const b = paths(after, "");
  const changed = new Set();
  for (const [k, v] of b) if (a.get(k) !== v) changed.add(k);
  for (const k of a.keys()) if (!b.has(k)) changed.add(k);
  const shown = [...changed].filter((p) => {
    const parts = p.split(".");
    return !BOOKKEEPING_TOP.has(parts[0]) && !BOOKKEEPING_LEAF.has(parts[parts.length - 1]) && !parts.includes("provenance");
  });
  // An item that came or went is one change ("tasks.t1"), not each of its fields.
  const itemOf = (p) => p.split(".").slice(0, 2).join(".");
  const inA = new Set([...a.keys()].map(itemOf));
  const inB = new Set([...b.keys()].map(itemOf));
  const out = new Set(shown.map((p) => (p.split(".").length > 2 && !(inA.has(itemOf(p)) && inB.has(itemOf(p))) ? itemOf(p) : p)));
  // A collection whose items are listed is not listed itself (an empty list was one leaf).
  return new Set([...out].filter((p) => ![...out].some((q) => q !== p && q.startsWith(p + "."))));
}

class RunPage {
  constructor(runId) {
    this.runId = runId;
    this.start = 0;
    this.total = 0;
    this.history = [];
    this.selected = null;  // the decision whose state is shown (null: the current state)
  }

  async open() {
    document.title = `${this.runId} · runstate`;
    let state;
    try {
      state = await api(`/runs/${seg(this.runId)}`);
      const probe = await api(`/runs/${seg(this.runId)}/history?limit=1`, { raw: true });
      this.total = Number(probe.headers.get("x-total-count"));
    } catch (e) {
      return failure(e, `Run ${this.runId}`);
    }
    this.current = state;
    this.start = Math.max(0, this.total - PAGE_PATCHES);
    this.header = el("div", { id: "summary" });
    this.timeline = el("ol", { class: "timeline", id: "timeline", "aria-label": "Patches in log order" });
    this.pager = el("div", { class: "pager" });
    this.statePanel = el("section", { id: "state", "aria-live": "polite" });
    this.side = el("section", { id: "side" });
    show(
      el("h1", {}, "Run ", el("span", { class: "mono" }, this.runId)),
      this.header,
      el("div", { class: "run" },
        el("section", { "aria-labelledby": "tl" }, el("h2", { id: "tl" }, "Timeline"),
          el("p", { class: "muted" }, "Choose a patch to see the state after it (arrow keys move, Enter opens)."),
          this.pager, this.timeline),
        el("div", {}, this.statePanel, this.side)),
      el("dialog", { id: "explain", "aria-labelledby": "explain-title" }),
    );
    this.renderSummary(state);
    await this.loadPage();
    const wanted = Number(new URLSearchParams(location.search).get("revision"));
    const at = wanted ? this.history.find((d) => d.outcome === "accepted" && d.revision === wanted) : null;
    if (at) await this.select(at);
    else this.renderState(state, null, "current");
    this.loadSide();
    this.follow();
  }

  renderSummary(s) {
    this.header.replaceChildren(el("p", {},
      el("span", { class: "tag" }, s.status), " ", s.phase ? `phase ${s.phase} · ` : "",
      `revision ${s.revision} · agent version ${s.agent_version} · updated ${when(s.updated_at)}`,
      s.waiting ? ` · waiting for ${s.waiting.kind}: ${s.waiting.reason}` : ""));
  }

  async loadPage() {
    const q = new URLSearchParams({ start: this.start, limit: PAGE_PATCHES });
    const resp = await api(`/runs/${seg(this.runId)}/history?${q}`, { raw: true });
    this.history = await resp.json();
    this.total = Number(resp.headers.get("x-total-count"));
    this.renderTimeline();
  }

  renderTimeline() {
    const items = this.history.map((d) => el("li", {}, this.patchButton(d)));
    this.timeline.replaceChildren(...items);
    const first = this.start + 1;
    const last = this.start + this.history.length;
    this.pager.replaceChildren(
      el("button", { type: "button", disabled: this.start === 0, onclick: () => this.page(-PAGE_PATCHES) }, "Earlier"),
      el("span", { class: "muted", id: "range" }, `patches ${first}–${last} of ${this.total}`),
      el("button", { type: "button", disabled: last >= this.total, onclick: () => this.page(PAGE_PATCHES) }, "Later"));
  }

  patchButton(d) {
    const ok = d.outcome === "accepted";
    const b = el("button", {
      type: "button", class: `patch ${d.outcome}`, "data-offset": d.offset, "data-revision": ok ? d.revision : null,
      "aria-current": this.selected && this.selected.offset === d.offset ? "true" : null,
      onclick: () => this.select(d), onkeydown: (ev) => this.keys(ev, b),
    },
      el("span", { class: "verdict" }, ok ? "accepted" : "REJECTED"),
      ` r${d.expected_revision} → r${ok ? d.revision : d.expected_revision}${d.rebased ? " (rebased)" : ""}`,
      !ok && el("span", { class: "reason" }, `${d.reason}${d.rule ? ` [${d.rule}]` : ""}: ${d.message ?? ""}`),
      el("span", { class: "meta" }, `@${d.offset} · ${d.agent_id}@${d.agent_version} · ${d.event_types.join(", ")} · ${when(d.created_at)}`));
    return b;
  }

  keys(ev, button) {
    const all = [...this.timeline.querySelectorAll("button.patch")];
    const i = all.indexOf(button);
    const to = { ArrowDown: i + 1, ArrowUp: i - 1, Home: 0, End: all.length - 1 }[ev.key];
    if (to === undefined) return;
    ev.preventDefault();
    all[Math.max(0, Math.min(all.length - 1, to))].focus();
  }

  async page(delta) {
    this.start = Math.max(0, Math.min(this.start + delta, Math.max(0, this.total - 1)));
    await this.loadPage();
  }

  async select(d) {
    this.selected = d;
    for (const b of this.timeline.querySelectorAll("button.patch")) {
      if (Number(b.dataset.offset) === d.offset) b.setAttribute("aria-current", "true");
      else b.removeAttribute("aria-current");
    }
    const url = new URL(location.href);
    if (d.outcome !== "accepted") {
      url.searchParams.delete("revision");
      history.replaceState(null, "", url);
      return this.statePanel.replaceChildren(el("h2", {}, `Rejected patch @${d.offset}`), el("div", { class: "panel" },
        el("p", {}, el("strong", {}, d.reason), d.rule ? ` (rule ${d.rule})` : "", ": ", d.message ?? ""),
        d.event_index !== null && d.event_index !== undefined ? el("p", {}, `at event ${d.event_index} (${d.event_types[d.event_index] ?? "?"})`) : null,
        el("p", { class: "muted" }, `patch ${d.patch_id} by ${d.agent_id}@${d.agent_version}, based on revision ${d.expected_revision}; nothing changed`)));
    }
    url.searchParams.set("revision", d.revision);
    history.replaceState(null, "", url);
    const id = seg(this.runId);
    try {
      const [state, before] = await Promise.all([
        api(`/runs/${id}?revision=${d.revision}`),
        d.revision > 1 ? api(`/runs/${id}?revision=${d.revision - 1}`) : Promise.resolve(null),
      ]);
      this.renderState(state, before, `after patch @${d.offset}`);
    } catch (e) {
      this.statePanel.replaceChildren(el("div", { class: "error", role: "alert" },
        e instanceof ApiError ? `${e.code}: ${e.message}` : String(e)));
    }
  }

  renderState(s, before, label) {
    const changed = before ? changedPaths(before, s) : new Set();
    const mark = (path) => [...changed].some((c) => c === path || c.startsWith(path + ".") || path.startsWith(c + "."));
    const field = (path, text) => el("button", {
      type: "button", class: `field${mark(path) ? " changed" : ""}`, "data-path": path,
      title: `why does ${path} have this value?`, onclick: () => this.explain(path),
    }, text);
    const out = [el("h2", {}, `State at revision ${s.revision}`, el("span", { class: "muted" }, ` (${label})`))];
    if (before) {
      out.push(el("p", { class: "muted", id: "changes" }, changed.size
        ? `Changed since revision ${before.revision}: ${[...changed].join(", ")}`
        : `Nothing visible changed since revision ${before.revision}.`));
    }
    const goal = el("div", { class: "panel", id: "goal" }, el("h3", {}, "Goal"),
      el("p", {}, field("goal.statement", s.goal.statement)),
      s.goal.acceptance.length ? el("p", {}, "Acceptance: ", s.goal.acceptance.join("; ")) : null,
      s.goal.scope.include.length || s.goal.scope.exclude.length
        ? el("p", {}, `Scope: ${s.goal.scope.include.join(", ") || "everything"}${s.goal.scope.exclude.length ? ` except ${s.goal.scope.exclude.join(", ")}` : ""}`) : null,
      s.goal.constraints.length ? el("ul", { class: "items" }, s.goal.constraints.map((c) => el("li", {},
        `${c.key} = `, field(`goal.constraints.${c.key}.value`, c.value),
        c.supersedes ? el("span", { class: "muted" }, ` (was ${c.supersedes.value} at r${c.supersedes.set_at_revision})`) : null))) : null);
    out.push(el("div", { class: "panel" },
      el("p", {}, "Status ", field("status", s.status), s.phase ? [" · phase ", field("phase", s.phase)] : null,
        s.active_task_id ? [" · active task ", field("active_task_id", s.active_task_id)] : null),
      s.waiting ? el("p", {}, `Waiting (${s.waiting.kind}): ${s.waiting.reason}`) : null,
      el("p", {}, `Budget: ${s.budgets.tokens_used} tokens used`,
        s.budgets.tokens_remaining !== null ? [", ", field("budgets.tokens_remaining", `${s.budgets.tokens_remaining} remaining`)] : null,
        s.budgets.deadline ? `, deadline ${when(s.budgets.deadline)}` : ""),
      s.workspace_ref ? el("p", { id: "workspace" }, `Workspace ${s.workspace_ref.workspace_id}: base `,
        field("workspace_ref.base_commit", s.workspace_ref.base_commit || "?"), " current ",
        field("workspace_ref.current_commit", s.workspace_ref.current_commit || "?"),
        s.workspace_ref.uncommitted_changes ? ` (uncommitted: ${s.workspace_ref.uncommitted_changes})` : "") : null,
      s.revoked_agents.length ? el("p", { id: "revoked" }, "Revoked agents (their patches are refused): ",
        s.revoked_agents.join(", ")) : null,
      s.migrated_from ? el("p", { class: "muted" }, `Migrated from schema v${s.migrated_from.version} `
        + `(path ${s.migrated_from.path.join(" → ")})`
        + (s.effect_ledger_ref ? `; its effects are in the external ledger ${s.effect_ledger_ref}` : "")) : null,
      s.last_transition ? el("p", { class: "muted" }, `Last transition: ${s.last_transition.action}`) : null));
    out.splice(out.length - 1, 0, goal);
    for (const [kind, title, key, render] of SECTIONS) {
      const items = s[kind] || [];
      if (!items.length) continue;
      out.push(el("div", { class: "panel", id: kind }, el("h3", {}, `${title} (${items.length})`),
        el("ul", { class: "items" }, items.map((it) => {
          const base = `${kind}.${it[key]}`;
          const parts = render(it, s).map((p) => Array.isArray(p) ? field(`${base}.${p[0]}`, p[1]) : p);
          return el("li", { class: mark(base) ? "changed" : null }, el("span", { class: "mono" }, `${it[key]}: `), parts);
        }))));
    }
    if (s.graph_checkpoints && s.graph_checkpoints.length) {
      const values = (s.graph_values || []).length;
      out.push(el("div", { class: "panel" }, el("h3", {}, `LangGraph checkpoints (${s.graph_checkpoints.length})`),
        el("p", { class: "muted" }, "Saved by runstate's LangGraph checkpointer; their values are LangGraph's serialized bytes"
          + (values ? `, ${values} channel value${values === 1 ? "" : "s"} kept once per version.` : "."))));
    }
    this.statePanel.replaceChildren(...out);
  }

  async explain(path) {
    const dialog = document.getElementById("explain");
    let body;
    try {
      const changes = await api(`/runs/${seg(this.runId)}/explain?path=${encodeURIComponent(path)}`);
      body = changes.length ? el("ol", { id: "explain-list" }, changes.map((c) => el("li", {},
        el("a", { href: `${runLink(this.runId)}?revision=${c.revision}` }, `r${c.revision} @${c.offset}`),
        ` ${c.agent_id}@${c.agent_version} (${c.event_types.join(", ")}): `,
        el("code", {}, JSON.stringify(c.before)), " → ", el("code", {}, JSON.stringify(c.after)))))
        : el("p", {}, "No patch changed it.");
    } catch (e) {
      body = e instanceof ApiError && e.code === "never_set" ? el("p", {}, "No patch changed it.")
        : el("div", { class: "error", role: "alert" }, e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
    }
    dialog.replaceChildren(el("h2", { id: "explain-title" }, "Why ", el("code", {}, path), " has its value"), body,
      el("form", { method: "dialog" }, el("button", { type: "submit", autofocus: true }, "Close")));
    dialog.showModal();
  }

  async loadSide() {
    const id = seg(this.runId);
    const parts = [el("h2", {}, "Checkpoints and resume")];
    try {
      const cps = await api(`/runs/${id}/checkpoints`);
      parts.push(el("table", { id: "checkpoints" },
        el("thead", {}, el("tr", {}, ["revision", "verdict", "triggers", "at"].map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, cps.map((c) => el("tr", {}, el("td", {}, String(c.revision)),
          el("td", {}, el("span", { class: `tag ${c.verdict === "safe" ? "ok" : "bad"}` }, c.verdict)),
          el("td", {}, c.triggers.join(", ")), el("td", {}, when(c.at)))))));
      const plan = await api(`/runs/${id}/resume`);
      const r = plan.checkpoint.reconcile;
      parts.push(el("div", { class: "panel", id: "resume" },
        el("p", {}, `Resume from revision ${plan.checkpoint.revision}: `, el("strong", {}, plan.checkpoint.verdict),
          ` (${plan.tail.length} patch${plan.tail.length === 1 ? "" : "es"} after it)`),
        r.effects.length ? el("p", {}, "Effects to reconcile: ", r.effects.map((e) => `${e.id} (${e.kind ?? "effect"} on ${e.target ?? "?"})`).join(", ")) : null,
        r.tool_calls.length ? el("p", {}, "Calls in flight: ", r.tool_calls.map((c) => `${c.call_id} (${c.tool})`).join(", ")) : null,
        r.observations.length ? el("p", {}, "Observations to re-read: ", r.observations.map((o) => o.subject).join(", ")) : null));
    } catch (e) {
      parts.push(el("p", { class: "muted" }, e instanceof ApiError && e.status === 404 ? "No checkpoint yet." : `Unavailable: ${e.message}`));
    }
    this.side.replaceChildren(...parts);
  }

  async follow() {
    // The decisions as they happen (the SSE route), read with fetch so that a token can go along.
    const headers = { accept: "text/event-stream" };
    if (token()) headers.authorization = `Bearer ${token()}`;
    const last = this.history.length ? this.history[this.history.length - 1].offset : null;
    if (last !== null) headers["last-event-id"] = String(last);
    try {
      const resp = await fetch(`/runs/${seg(this.runId)}/events`, { headers });
      if (!resp.ok || !resp.body) return;
      document.getElementById("live").hidden = false;
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (data) await this.arrived(JSON.parse(data));
        }
      }
    } catch (_) { /* the stream ended: the page stays as it is */ }
    document.getElementById("live").hidden = true;
  }

  async arrived(d) {
    if (this.history.some((h) => h.offset === d.offset)) return;
    this.total += 1;
    const onLastPage = this.start + this.history.length >= this.total - 1;
    if (onLastPage) {
      this.history.push(d);
      this.timeline.append(el("li", {}, this.patchButton(d)));
      this.pager.querySelector("#range").textContent = `patches ${this.start + 1}–${this.start + this.history.length} of ${this.total}`;
    }
    if (d.outcome === "accepted") {
      this.current = await api(`/runs/${seg(this.runId)}`);
      this.renderSummary(this.current);
      if (this.selected === null) this.renderState(this.current, null, "current");
    }
  }
}

// --- /ui/deadletters ----------------------------------------------------------------------------

async function deadLettersPage() {
  document.title = "dead letters · runstate";
  let letters;
  try {
    letters = await api("/deadletters");
  } catch (e) {
    return failure(e, "Dead letters");
  }
  show(el("h1", {}, "Dead letters"),
    el("p", { class: "muted" }, "Records of the log that could not be decided, with the reason. They are kept; nothing was applied."),
    letters.length ? el("table", { id: "deadletters" },
      el("thead", {}, el("tr", {}, ["partition", "offset", "run (key)", "reason", "detail", "bytes"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, letters.map((d) => el("tr", {}, el("td", {}, String(d.partition)), el("td", {}, String(d.offset)),
        el("td", { class: "mono" }, d.key ?? ""), el("td", {}, d.reason), el("td", {}, d.detail), el("td", {}, String(d.size))))))
      : el("p", {}, "None."));
}

// --- routing ------------------------------------------------------------------------------------

function route() {
  const path = location.pathname.replace(/\/+$/, "");
  const m = path.match(/^\/ui\/runs\/(.+)$/);
  if (path === "/ui") return runsPage();
  if (m) return new RunPage(decodeURIComponent(m[1])).open();
  if (path === "/ui/deadletters") return deadLettersPage();
  document.title = "not found · runstate";
  show(el("h1", {}, "Page not found"), el("p", {}, el("a", { href: "/ui" }, "Back to the runs")));
}

route();

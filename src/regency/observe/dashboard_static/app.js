// The regency dashboard: draws the admin API of the controller that served this page.
//
// The bearer token comes in the URL fragment (#token=...), which a browser never sends to a
// server; it is kept in this tab's sessionStorage and taken off the address bar. Every element
// is made from text (textContent, createElement), never from HTML: names and failure texts come
// from the mesh and must not run as code in a page that holds the token.
"use strict";

(function () {
  const TOKEN_KEY = "regency-admin-token";
  const REFRESH_MS = 2000;
  const WINDOW_S = 60;
  const { byId, el } = dom;
  const ENDED = new Set(["stopped", "failed"]);

  const state = {
    token: null,
    paused: false,
    showEnded: true,
    busy: false,
    timer: null,
    tree: null,
    telemetry: null,
    stacksRef: null,
    // Failure tracebacks the user opened: kept open when a refresh redraws them.
    openDetails: new Set(),
  };

  // ---- the token ------------------------------------------------------------------------

  function takeToken() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    const given = fragment.get("token");
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given);
      history.replaceState(null, "", location.pathname + location.search);
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function askForToken(why) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(state.timer);
    byId("token-why").textContent = why;
    byId("token-form").hidden = false;
    byId("controller").textContent = "";
    setStatus("error", "not connected");
  }

  function onTokenSubmit(event) {
    event.preventDefault();
    const token = byId("token-input").value.trim();
    if (!token) return;
    byId("token-input").value = "";
    sessionStorage.setItem(TOKEN_KEY, token);
    state.token = token;
    byId("token-form").hidden = true;
    refresh();
  }

  // ---- talking to the admin API ---------------------------------------------------------

  async function api(path) {
    let response;
    try {
      response = await fetch(path, {
        headers: { Authorization: "Bearer " + state.token },
        cache: "no-store",
      });
    } catch (err) {
      return { status: 0, body: null, error: "cannot reach the controller (" + err.message + ")" };
    }
    let body = null;
    try {
      body = await response.json();
    } catch (err) {
      body = null;
    }
    const error = response.ok ? null : (body && body.error) || "HTTP " + response.status;
    return { status: response.status, body: body, error: error };
  }

  async function refresh() {
    if (state.busy || !state.token) return;
    state.busy = true;
    clearTimeout(state.timer);
    try {
      const [tree, telemetry] = await Promise.all([
        api("/v1/tree"),
        api("/v1/telemetry/endpoints?window_s=" + WINDOW_S),
      ]);
      if (tree.status === 401) {
        askForToken(
          "The controller refused this token (HTTP 401): open the link that " +
            "regency dashboard prints, or paste the token of this controller."
        );
        return;
      }
      state.telemetry = telemetry;
      if (tree.error) {
        setStatus("error", tree.error + " (showing the last answer)");
      } else {
        state.tree = tree.body;
        setStatus("ok", "updated " + new Date().toLocaleTimeString());
      }
      render();
    } finally {
      state.busy = false;
      if (!state.paused && state.token) state.timer = setTimeout(refresh, REFRESH_MS);
    }
  }

  function setStatus(kind, text) {
    const status = byId("status");
    status.className = "status-" + kind;
    status.textContent = text;
  }

  function render() {
    if (state.tree) {
      renderTree(state.tree);
      renderFailures(state.tree, state.telemetry);
    }
    if (state.telemetry) charts.renderTelemetry(state.telemetry);
  }

  // ---- the tree -------------------------------------------------------------------------

  function badge(value) {
    const name = value || "unknown";
    return el("span", { class: "state state-" + name }, name);
  }

  function pointText(point) {
    const parts = Object.entries(point || {}).map(([k, v]) => k + "=" + v);
    return parts.length ? "{" + parts.join(", ") + "}" : "";
  }

  function tally(counts, value) {
    counts[value || "unknown"] = (counts[value || "unknown"] || 0) + 1;
  }

  function plural(n, what) {
    return n + " " + what + (n === 1 ? "" : "s");
  }

  function tallyText(counts, what) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const parts = Object.entries(counts).map(([k, v]) => v + " " + k);
    return plural(total, what) + (parts.length ? " (" + parts.join(", ") + ")" : "");
  }

  function renderTree(tree) {
    byId("controller").textContent =
      "controller pid " + tree.pid + " · job " + tree.job_id + " · " + tree.address;
    const procCounts = {};
    const actorCounts = {};
    let hidden = 0;
    const hosts = [];
    for (const host of tree.hosts || []) {
      const procs = [];
      for (const proc of host.procs || []) {
        tally(procCounts, proc.state);
        const rows = [];
        for (const actor of proc.actors || []) {
          tally(actorCounts, actor.state);
          if (state.showEnded || !ENDED.has(actor.state)) rows.push(actorRow(actor));
          else hidden += 1;
        }
        if (state.showEnded || !ENDED.has(proc.state)) procs.push(procBlock(proc, rows));
        else hidden += 1 + rows.length;
      }
      hosts.push(
        el(
          "section",
          { class: "host", "data-ref": host.ref },
          el("h3", {}, "host ", el("code", {}, host.address)),
          procs.length ? procs : el("p", { class: "muted" }, "nothing to show")
        )
      );
    }
    let summary =
      plural((tree.hosts || []).length, "host") +
      " · " +
      tallyText(procCounts, "proc") +
      " · " +
      tallyText(actorCounts, "actor");
    if (hidden) summary += " · " + hidden + " stopped/failed hidden";
    byId("summary").textContent = summary;
    byId("tree").replaceChildren(
      ...(hosts.length ? hosts : [el("p", { class: "muted" }, "This controller runs no procs.")])
    );
  }

  function procBlock(proc, rows) {
    const head = el(
      "button",
      { type: "button", class: "proc-head", title: "show this proc's stacks" },
      badge(proc.state),
      " proc mesh ",
      el("b", {}, proc.proc_mesh),
      " rank " + proc.rank + " " + pointText(proc.point) + " ",
      el("code", { class: "muted" }, proc.address)
    );
    head.addEventListener("click", () => showStacks(proc));
    const selected = proc.ref === state.stacksRef ? " selected" : "";
    return el(
      "div",
      { class: "proc" + selected, "data-ref": proc.ref, "data-state": proc.state },
      head,
      proc.reason ? el("div", { class: "reason" }, proc.reason) : null,
      rows.length
        ? el(
            "table",
            { class: "actors" },
            el(
              "thead",
              {},
              el(
                "tr",
                {},
                ["actor", "class", "state", "restarts", "handled", "mailbox"].map((h) =>
                  el("th", {}, h)
                )
              )
            ),
            el("tbody", {}, rows)
          )
        : el("p", { class: "muted" }, "no actors")
    );
  }

  function actorRow(actor) {
    const name = el(
      "td",
      { class: "actor-name", title: actor.name },
      el("b", {}, actor.actor_mesh),
      "[" + actor.rank + "] " + pointText(actor.point)
    );
    if (actor.failure) name.append(failureText(actor.failure, "tree " + actor.ref));
    return el(
      "tr",
      { class: "actor", "data-ref": actor.ref, "data-state": actor.state },
      name,
      el("td", { class: "muted" }, actor["class"]),
      el("td", {}, badge(actor.state)),
      el("td", { class: "num restarts" }, actor.restarts),
      el("td", { class: "num handled" }, number(actor.messages_handled)),
      el("td", { class: "num mailbox" }, number(actor.mailbox_depth))
    );
  }

  // ``key`` names the place the failure is shown, so that it stays open across refreshes.
  function failureText(text, key) {
    const lines = String(text).split("\n").filter((line) => line.trim());
    const last = lines.length ? lines[lines.length - 1] : String(text);
    if (lines.length <= 1) return el("div", { class: "failure" }, last);
    const details = el(
      "details",
      { class: "failure" },
      el("summary", {}, last),
      el("pre", {}, String(text))
    );
    details.open = state.openDetails.has(key);
    details.addEventListener("toggle", () => {
      if (details.open) state.openDetails.add(key);
      else state.openDetails.delete(key);
    });
    return details;
  }

  function number(value) {
    return value === null || value === undefined ? "–" : String(value);
  }

  // ---- stacks ---------------------------------------------------------------------------

  async function showStacks(proc) {
    state.stacksRef = proc.ref;
    for (const node of document.querySelectorAll(".proc.selected")) {
      node.classList.remove("selected");
    }
    const block = document.querySelector('.proc[data-ref="' + CSS.escape(proc.ref) + '"]');
    if (block) block.classList.add("selected");
    byId("stacks-title").textContent =
      "Stacks of proc mesh " + proc.proc_mesh + " rank " + proc.rank + " at " + proc.address;
    const out = byId("stacks");
    if (ENDED.has(proc.state)) {
      out.textContent =
        "No stacks: the proc has " + proc.state + (proc.reason ? ": " + proc.reason : "") + ".";
      return;
    }
    out.textContent = "Fetching the stacks…";
    const answer = await api("/v1/pyspy/" + encodeURIComponent(proc.ref));
    if (state.stacksRef !== proc.ref) return; // another proc was clicked meanwhile
    out.textContent = answer.error ? "Cannot get the stacks: " + answer.error : answer.body.stacks;
  }

  // ---- failures -------------------------------------------------------------------------

  function renderFailures(tree, telemetry) {
    const items = [];
    for (const host of tree.hosts || []) {
      for (const proc of host.procs || []) {
        if (proc.state === "failed") {
          items.push(
            failureItem(
              "proc mesh " + proc.proc_mesh + " rank " + proc.rank + " on " + host.address,
              proc.ref,
              null,
              proc.reason || "failed"
            )
          );
        }
        for (const actor of proc.actors || []) {
          if (actor.state === "failed") {
            items.push(
              failureItem(
                "actor " + actor.actor_mesh + "[" + actor.rank + "] on " + host.address,
                actor.ref,
                null,
                actor.failure || "failed"
              )
            );
          }
        }
      }
    }
    const recent = telemetry && telemetry.body && telemetry.body.failures;
    for (const failure of (Array.isArray(recent) ? recent : []).slice().reverse()) {
      const what = (failure.kind || "call") + " " + failure.ref;
      items.push(failureItem(what, failure.ref, failure.t, failure.text));
    }
    byId("failures").replaceChildren(
      ...(items.length ? items : [el("li", { class: "muted" }, "None.")])
    );
  }

  function failureItem(what, ref, when, text) {
    return el(
      "li",
      { class: "failure-item", "data-ref": ref },
      el("b", {}, what),
      when ? el("span", { class: "muted" }, " at " + new Date(when * 1000).toLocaleTimeString()) : null,
      failureText(text, "failures " + ref + " " + (when || ""))
    );
  }


  // ---- SQL over the job's telemetry tables ----------------------------------------------

  async function onSqlSubmit(event) {
    event.preventDefault();
    const sql = byId("sql-input").value.trim();
    if (!sql || !state.token) return;
    byId("sql-status").textContent = "running…";
    const answer = await api("/v1/telemetry/query?sql=" + encodeURIComponent(sql));
    if (answer.error) {
      byId("sql-status").textContent = answer.error;
      byId("sql-result").replaceChildren();
      return;
    }
    const body = answer.body;
    const count = body.rows.length + " row" + (body.rows.length === 1 ? "" : "s");
    byId("sql-status").textContent = body.truncated ? "the first " + count : count;
    const cell = (value) => (value === null ? "NULL" : String(value));
    byId("sql-result").replaceChildren(
      el(
        "table",
        { class: "sql" },
        el("thead", {}, el("tr", {}, body.columns.map((c) => el("th", {}, c)))),
        el("tbody", {}, body.rows.map((row) => el("tr", {}, row.map((v) => el("td", {}, cell(v))))))
      )
    );
  }

  // ---- start ----------------------------------------------------------------------------

  function start() {
    byId("token-form").addEventListener("submit", onTokenSubmit);
    byId("sql-form").addEventListener("submit", onSqlSubmit);
    byId("show-ended").addEventListener("change", (event) => {
      state.showEnded = event.target.checked;
      render();
    });
    byId("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      byId("pause").textContent = state.paused ? "resume" : "pause";
      if (state.paused) {
        clearTimeout(state.timer);
        setStatus("paused", "paused");
      } else {
        refresh();
      }
    });
    byId("refresh").addEventListener("click", () => refresh());
    state.token = takeToken();
    if (state.token) refresh();
    else askForToken(byId("token-why").textContent);
  }

  start();
})();

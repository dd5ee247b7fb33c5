// The regency dashboard's endpoint panel: per-endpoint latency and call-rate charts (SVG) from
// the admin API's telemetry route, or a line saying there is no telemetry.
"use strict";

const charts = (function () {
  const MAX_CHARTS = 8;
  const { byId, el, svg, fixed } = dom;

  function renderTelemetry(answer) {
    const box = byId("telemetry");
    byId("telemetry-window").textContent = "";
    if (answer.status === 404) {
      box.replaceChildren(
        el(
          "p",
          { class: "muted telemetry-off" },
          "Telemetry off / not available: this controller serves no telemetry, so there are " +
            "no latency or rate charts."
        )
      );
      return;
    }
    if (answer.error) {
      box.replaceChildren(el("p", { class: "error" }, "Telemetry: " + answer.error));
      return;
    }
    const data = answer.body;
    byId("telemetry-window").textContent = "(last " + data.window_s + " s)";
    if (!data.enabled) {
      box.replaceChildren(
        el("p", { class: "muted telemetry-off" }, "Telemetry off: this controller records none.")
      );
      return;
    }
    const endpoints = (data.endpoints || []).slice().sort((a, b) => b.calls - a.calls);
    if (!endpoints.length) {
      box.replaceChildren(el("p", { class: "muted" }, "No calls in the last " + data.window_s + " s."));
      return;
    }
    const t1 = data.now;
    const t0 = data.now - data.window_s;
    const cards = endpoints.slice(0, MAX_CHARTS).map((e) => endpointCard(e, t0, t1, data.bucket_s));
    if (endpoints.length > MAX_CHARTS) {
      cards.push(el("p", { class: "muted" }, endpoints.length - MAX_CHARTS + " more endpoints not drawn."));
    }
    box.replaceChildren(...cards);
  }

  function endpointCard(endpoint, t0, t1, bucketS) {
    const series = endpoint.series || [];
    const stats =
      endpoint.calls + " calls · " + endpoint.errors + " errors · " +
      fixed(endpoint.rate_per_s) + "/s · p50 " + fixed(endpoint.p50_ms) + " ms · p95 " +
      fixed(endpoint.p95_ms) + " ms · max " + fixed(endpoint.max_ms) + " ms";
    return el(
      "div",
      { class: "endpoint" + (endpoint.errors ? " has-errors" : ""), "data-endpoint": endpoint.name },
      el("h3", {}, el("code", {}, endpoint.name)),
      el("p", { class: "muted" }, stats),
      el(
        "div",
        { class: "charts" },
        el("figure", {}, chart("line", series, t0, t1, bucketS, (p) => p.p50_ms, " ms",
          "p50 latency of " + endpoint.name), el("figcaption", {}, "p50 latency")),
        el("figure", {}, chart("bars", series, t0, t1, bucketS, (p) => p.calls / bucketS, "/s",
          "calls per second of " + endpoint.name), el("figcaption", {}, "calls per second"))
      )
    );
  }

  function niceMax(value) {
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 5, 10]) {
      if (value <= step * power) return step * power;
    }
    return 10 * power;
  }

  // One chart of an endpoint's buckets: "bars" (one a bucket) or "line" (one point a bucket
  // with calls, broken where a bucket had none). The x axis runs over whole buckets.
  function chart(kind, series, t0, t1, bucketS, value, unit, label) {
    const W = 240;
    const H = 64;
    const left = 44;
    const right = W - 2;
    const top = 6;
    const bottom = H - 4;
    const first = Math.floor(t0 / bucketS) * bucketS;
    const last = Math.ceil(t1 / bucketS) * bucketS;
    const x = (t) => left + ((right - left) * (t - first)) / Math.max(last - first, 1);
    const inside = series.filter((p) => p.t >= first && p.t < last);
    const values = inside.map(value).filter((v) => Number.isFinite(v));
    const high = values.length && Math.max(...values) > 0 ? niceMax(Math.max(...values)) : 1;
    const y = (v) => bottom - ((bottom - top) * v) / high;
    const root = svg("svg", {
      viewBox: "0 0 " + W + " " + H,
      width: W,
      height: H,
      class: "chart chart-" + kind,
      role: "img",
      "aria-label": label,
    });
    root.append(
      svg("line", { x1: left, y1: bottom, x2: right, y2: bottom, class: "axis" }),
      svg("line", { x1: left, y1: top, x2: left, y2: bottom, class: "axis" }),
      svg("text", { x: left - 4, y: top + 8, "text-anchor": "end", class: "tick" }, fixed(high) + unit),
      svg("text", { x: left - 4, y: bottom, "text-anchor": "end", class: "tick" }, "0")
    );
    const tip = (p) => fixed(value(p)) + unit + " at " + new Date(p.t * 1000).toLocaleTimeString();
    if (kind === "bars") {
      for (const p of inside) {
        const v = value(p);
        const bar = svg("rect", {
          x: x(p.t) + 0.5,
          y: y(v),
          width: Math.max(x(p.t + bucketS) - x(p.t) - 1, 1),
          height: Math.max(bottom - y(v), 0),
          class: "bar",
        });
        bar.append(svg("title", {}, tip(p)));
        root.append(bar);
      }
      return root;
    }
    const middle = (p) => x(p.t + bucketS / 2);
    let run = [];
    const runs = [run];
    for (const p of inside) {
      if (p.calls > 0 && Number.isFinite(value(p))) run.push(p);
      else if (run.length) runs.push((run = []));
    }
    for (const points of runs.filter((r) => r.length > 1)) {
      root.append(
        svg("polyline", {
          points: points.map((p) => middle(p) + "," + y(value(p))).join(" "),
          class: "line",
        })
      );
    }
    for (const p of runs.flat()) {
      const dot = svg("circle", { cx: middle(p), cy: y(value(p)), r: 2, class: "dot" });
      dot.append(svg("title", {}, tip(p)));
      root.append(dot);
    }
    return root;
  }

  return { renderTelemetry: renderTelemetry };
})();

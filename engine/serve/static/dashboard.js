// The dashboard's only script: the overview's live part and charts, and confirmations.
// Every request goes to the server that sent the page; text is never parsed as HTML except the
// server's own escaped fragment (/live).
"use strict";

(function () {
  const PALETTE = ["#0b5cad", "#b42318", "#1a7f37", "#9a6700", "#6f42c1", "#0a7a8a",
                   "#c2410c", "#4b5563", "#be185d", "#15803d", "#1d4ed8", "#a16207"];
  const HISTORY_EVERY_MS = 5000;

  // -- forms that act on every matching row ask first --------------------------------------
  document.addEventListener("submit", function (ev) {
    const ask = ev.target.getAttribute("data-confirm");
    if (ask && !window.confirm(ask)) ev.preventDefault();
  });

  // -- prioritize: the form as JSON to POST /api/prioritize, the answer shown as text --------
  const ask = document.getElementById("prioritize");
  if (ask) ask.addEventListener("submit", function (ev) {
    ev.preventDefault();
    const form = new FormData(ask);
    const urls = String(form.get("urls") || "").split("\n").map(function (u) { return u.trim(); })
      .filter(Boolean);
    const scope = String(form.get("scope") || "").trim();
    // Exactly what was typed: one URL, several, or a scope (both given: the server says no).
    const body = {mode: form.get("mode"), add: form.get("add") === "1"};
    if (urls.length === 1) body.url = urls[0];
    else if (urls.length) body.urls = urls;
    if (scope) body.scope = scope;
    const summary = document.getElementById("prioritize-summary");
    const answer = document.getElementById("prioritize-answer");
    summary.textContent = "Asking…";
    summary.className = "muted";
    const csrf = document.querySelector("meta[name=csrf-token]");
    fetch("/api/prioritize", {
      method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json", "Accept": "application/json",
                "X-CSRF-Token": csrf ? csrf.getAttribute("content") : ""},
    })
      .then(function (r) {
        return r.json().catch(function () { return {error: "HTTP " + r.status}; })
          .then(function (j) { return {ok: r.ok, status: r.status, json: j}; });
      })
      .then(function (a) {
        const j = a.json;
        if (!a.ok) {
          summary.textContent = "Refused (" + a.status + "), nothing changed: " + j.error;
          summary.className = "error";
        } else {
          summary.textContent = "matched " + j.matched + ", added " + j.added + ", unknown " +
            j.unknown_count + ", cleared " + j.cleared;
          summary.className = "flash";
        }
        answer.textContent = JSON.stringify(j, null, 2);
        answer.hidden = false;
      })
      .catch(function (e) {
        summary.textContent = "No answer from the server: " + e;
        summary.className = "error";
      });
  });

  // -- the overview's live part ------------------------------------------------------------
  const live = document.getElementById("live");
  if (live) {
    const every = Number(live.getAttribute("data-every-ms")) || 1000;
    let busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch("/live", {headers: {"Accept": "text/html"}})
        .then(function (r) {
          // A session that ended is sent to the login form: go there, not into the table.
          if (r.redirected) { window.location.assign(r.url); return Promise.reject(r.url); }
          return r.ok ? r.text() : Promise.reject(r.status);
        })
        .then(function (html) { live.innerHTML = html; })
        .catch(function () { /* the server restarting: the next tick tries again */ })
        .finally(function () { busy = false; });
    }, every);
  }

  // -- the charts ----------------------------------------------------------------------------
  const boxes = Array.prototype.slice.call(document.querySelectorAll(".chart"));
  if (!boxes.length || typeof uPlot === "undefined") return;
  const charts = new Map();  // box -> {plot, lanes}
  window.lanesCharts = charts;  // the browser tests read the axes of what was drawn

  // From 0 up; age / TTL shows at least 0..1.5 (1.0 = exactly on time), even with no renders.
  function yRange(key) {
    const least = key === "age_over_ttl" ? 1.5 : 1;
    return function (u, min, max) { return [0, Math.max(least, (max || 0) * 1.1)]; };
  }

  // A tick as a person reads it, short enough for the axis: 0.25, 12, 950, 10k, 1.2M.
  function tick(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return +(v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e4) return +(v / 1e3).toFixed(a >= 1e5 ? 0 : 1) + "k";
    if (a >= 100 || v === Math.round(v)) return String(Math.round(v));
    return String(+v.toFixed(a >= 10 ? 1 : 2));
  }

  const UNITS = {renders_per_s: "renders / s", backlog: "rows due", age_over_ttl: "age ÷ TTL"};

  function options(box, lanes) {
    const key = box.getAttribute("data-series");
    return {
      width: Math.max(240, box.clientWidth - 4), height: 200,
      scales: {x: {time: true}, y: {range: yRange(key)}},
      series: [{}].concat(lanes.map(function (name, i) {  // the lanes' labels
        return {label: name, stroke: PALETTE[i % PALETTE.length], width: 1.5};
      })),
      axes: [
        {label: "real time (this server's clock)", labelSize: 18, size: 56},
        {label: UNITS[key], labelSize: 18, values: function (u, splits) {
          return splits.map(tick);
        }, size: function (u, values, axisIdx) {
          // As wide as the widest tick drawn, measured in the axis's own font (the canvas counts
          // device pixels): "10k" never reads "0k", nor "100M" "00M".
          const axis = u.axes[axisIdx];
          u.ctx.font = axis.font[0];
          const widest = Math.max(0, ...(values || []).map(function (s) {
            return u.ctx.measureText(s).width;
          })) / uPlot.pxRatio;
          return Math.ceil(axis.ticks.size + axis.gap + widest + 4);
        }},
      ],
      legend: {live: false},
    };
  }

  function note(h) {
    const el = document.getElementById("history-note");
    if (!el) return;
    const since = new Date(h.since_ms).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"});
    el.textContent = "Sampled by this server every " + h.every_s + " s" + (h.full ? "." :
      " since it started at " + since + ": the charts cover only the " +
      (h.covers_s < 120 ? Math.round(h.covers_s) + " s" : Math.round(h.covers_s / 60) + " min") +
      " it has been up, not the whole hour.");
  }

  function draw(h) {
    note(h);
    boxes.forEach(function (box) {
      const waiting = box.querySelector(".waiting");
      if (h.t.length < 2) {
        if (!waiting) {
          const note = document.createElement("p");
          note.className = "waiting note";
          note.textContent = "Collecting samples (one every " + h.every_s + " s)…";
          box.appendChild(note);
        }
        return;
      }
      if (waiting) waiting.remove();
      const key = box.getAttribute("data-series");
      const data = [h.t].concat(h[key]);
      const had = charts.get(box);
      if (had && had.lanes.join("\n") === h.labels.join("\n")) {
        had.plot.setData(data);
        return;
      }
      if (had) had.plot.destroy();
      charts.set(box, {plot: new uPlot(options(box, h.labels), data, box), lanes: h.labels});
    });
  }

  function history() {
    if (document.hidden && charts.size) return;
    fetch("/api/history")
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(draw)
      .catch(function () {});
  }

  history();
  setInterval(history, HISTORY_EVERY_MS);
  window.addEventListener("resize", function () {
    charts.forEach(function (c, box) {
      c.plot.setSize({width: Math.max(240, box.clientWidth - 4), height: 200});
    });
  });
})();

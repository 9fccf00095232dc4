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

  // -- the overview's live part ------------------------------------------------------------
  const live = document.getElementById("live");
  if (live) {
    const every = Number(live.getAttribute("data-every-ms")) || 1000;
    let busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch("/live", {headers: {"Accept": "text/html"}})
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) { live.innerHTML = html; })
        .catch(function () { /* the server restarting: the next tick tries again */ })
        .finally(function () { busy = false; });
    }, every);
  }

  // -- the charts ----------------------------------------------------------------------------
  const boxes = Array.prototype.slice.call(document.querySelectorAll(".chart"));
  if (!boxes.length || typeof uPlot === "undefined") return;
  const charts = new Map();  // box -> {plot, lanes}

  function options(box, lanes) {
    return {
      width: Math.max(240, box.clientWidth - 4), height: 200,
      scales: {x: {time: true}},
      series: [{}].concat(lanes.map(function (name, i) {
        return {label: name, stroke: PALETTE[i % PALETTE.length], width: 1.5};
      })),
      axes: [{}, {size: 50}],
      legend: {live: false},
    };
  }

  function draw(h) {
    boxes.forEach(function (box) {
      const key = box.getAttribute("data-series");
      const data = [h.t].concat(h[key]);
      const had = charts.get(box);
      if (had && had.lanes.join("\n") === h.lanes.join("\n")) {
        had.plot.setData(data);
        return;
      }
      if (had) had.plot.destroy();
      charts.set(box, {plot: new uPlot(options(box, h.lanes), data, box), lanes: h.lanes});
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

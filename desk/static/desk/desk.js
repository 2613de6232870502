/* The operators' desk: expiry countdowns and waiting times that tick, and pages that refresh
 * themselves while nobody works on them. A static file (no inline script), so a
 * Content-Security-Policy without 'unsafe-inline' keeps it working.
 */
(function () {
  "use strict";

  function span(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " m " + String(seconds % 60).padStart(2, "0") + " s";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h " + String(Math.floor((seconds % 3600) / 60)).padStart(2, "0") + " m";
    return Math.floor(seconds / 86400) + " d " + Math.floor((seconds % 86400) / 3600) + " h";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-countdown]").forEach(function (node) {
      var left = (Date.parse(node.dataset.countdown) - now) / 1000;
      node.textContent = left > 0 ? "in " + span(left) : "expired " + span(-left) + " ago";
      node.classList.toggle("desk-soon", left < 3600);
    });
    document.querySelectorAll("[data-since]").forEach(function (node) {
      node.textContent = span((now - Date.parse(node.dataset.since)) / 1000);
    });
  }

  /* Reload every N seconds (data-autorefresh on the dashboard; the queues' changelists get it
   * from the body class), unless the operator is busy here: a box ticked, a field touched,
   * text selected, or refreshing paused. */
  function autorefresh(seconds) {
    if (!seconds || seconds <= 0) return;
    var host = document.querySelector("#content h1") || document.querySelector("#content");
    var bar = document.createElement("p");
    bar.className = "desk-refresh";
    var label = document.createElement("span");
    var button = document.createElement("button");
    button.type = "button";
    bar.append(label, " ", button);
    host.insertAdjacentElement("afterend", bar);
    var paused = sessionStorage.getItem("desk-refresh-paused") === "1";
    var busy = false;
    var left = seconds;
    function show() {
      label.textContent = paused ? "Auto-refresh paused." : busy ? "Auto-refresh waits: you are working on this page."
        : "Refreshes in " + left + " s.";
      button.textContent = paused ? "Resume" : "Pause";
    }
    button.addEventListener("click", function () {
      paused = !paused;
      sessionStorage.setItem("desk-refresh-paused", paused ? "1" : "0");
      left = seconds;
      show();
    });
    document.addEventListener("input", function () { busy = true; show(); });
    document.addEventListener("change", function () { busy = true; show(); });
    setInterval(function () {
      var selection = window.getSelection && String(window.getSelection());
      if (paused || busy || selection) return show();
      left -= 1;
      if (left <= 0) {
        location.reload();
        return;
      }
      show();
    }, 1000);
    show();
  }

  tick();
  setInterval(tick, 1000);
  var dashboard = document.querySelector("[data-autorefresh]");
  var body = document.body;
  var queue = body.classList.contains("change-list") &&
    (body.classList.contains("model-approval") || body.classList.contains("model-unknowntoolcall"));
  var meta = document.querySelector('meta[name="warden-desk-refresh"]');
  var every = meta ? Number(meta.content) : 0;
  var seconds = dashboard || queue ? every : 0;
  autorefresh(seconds);
})();

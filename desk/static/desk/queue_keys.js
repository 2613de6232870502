/* Keyboard shortcuts of the approval queue and its decision pages (issue 29), documented on each
 * page. A key does what a click does — it follows the same link or submits the same form, so an
 * approval by keyboard goes through the same confirmation page and POST as one by mouse.
 *
 * Queue:     j / k next / previous · x select · a approve · r reject · o or Enter open · ? help
 * Request:   a approve… · r reject… · ? help
 * Confirm:   Enter confirms (outside the text boxes) · ? help
 *
 * Keys typed into a field, or with Ctrl / Alt / Meta, are the browser's, never ours.
 */
(function () {
  "use strict";

  var body = document.body;
  if (!body.classList.contains("model-approval")) return;
  var queue = body.classList.contains("change-list") && document.getElementById("result_list");
  var confirmPage = body.classList.contains("desk-decide") || body.classList.contains("desk-decide-bulk");
  var requestPage = body.classList.contains("change-form");
  if (!queue && !confirmPage && !requestPage) return;

  function typing(target) {
    // A ticked box keeps the focus after a click; the keys still work there.
    return target.closest && target.closest(
      "input:not([type=checkbox]):not([type=radio]), textarea, select, [contenteditable]") !== null;
  }

  /* The pages whose templates do not say their keys get the line here. */
  function hint(text) {
    if (document.getElementById("queue-keys-hint")) return;
    var where = document.querySelector("#content-main") || document.querySelector("#content");
    if (!where) return;
    var line = document.createElement("p");
    line.className = "desk-keys-hint";
    line.id = "queue-keys-hint";
    var strong = document.createElement("strong");
    strong.textContent = "Keyboard:";
    line.append(strong, " " + text);
    where.insertAdjacentElement("afterbegin", line);
  }

  function toggleHelp(show) {
    var help = document.getElementById("queue-keys-help");
    if (!help) return;
    help.hidden = show === undefined ? !help.hidden : !show;
  }

  // --- the queue --------------------------------------------------------------------------------

  var current = -1;

  function rows() {
    return Array.prototype.slice.call(queue.querySelectorAll("tbody tr"));
  }

  function select(index) {
    var all = rows();
    if (!all.length) return;
    index = Math.max(0, Math.min(all.length - 1, index));
    all.forEach(function (row) { row.classList.remove("desk-key-current"); row.removeAttribute("aria-current"); });
    var row = all[index];
    row.classList.add("desk-key-current");
    row.setAttribute("aria-current", "true");
    row.scrollIntoView({ block: "nearest" });
    current = index;
    // The operator is working on this page: desk.js's auto-refresh waits (it listens for input).
    document.dispatchEvent(new Event("input"));
  }

  function currentRow() {
    return current >= 0 ? rows()[current] : null;
  }

  function runAction(name) {
    var form = document.getElementById("changelist-form");
    var choice = form && form.querySelector('select[name="action"]');
    var go = form && form.querySelector('button[name="index"]');
    if (!choice || !go || !choice.querySelector('option[value="' + name + '"]')) return false;
    choice.value = name;
    go.click();
    return true;
  }

  function decide(decision) {
    if (queue.querySelector("tbody input.action-select:checked")) {
      runAction(decision === "approve" ? "approve_selected" : "reject_selected");
      return;
    }
    var row = currentRow();
    var link = row && row.querySelector(decision === "approve" ? "a.desk-approve" : "a.desk-reject");
    if (link) link.click();
  }

  function onQueueKey(event) {
    switch (event.key) {
      case "j": select(current + 1); break;
      case "k": select(current < 0 ? 0 : current - 1); break;
      case "x": {
        var row = currentRow();
        var box = row && row.querySelector("input.action-select");
        if (box) box.click();  // a click, so the admin counts it and marks the row
        break;
      }
      case "a": decide("approve"); break;
      case "r": decide("reject"); break;
      case "o":
      case "Enter": {
        if (event.key === "Enter" && event.target.closest && event.target.closest("a, button")) return false;
        var open = currentRow() && currentRow().querySelector("th a, td.field-order a");
        if (!open) return false;
        open.click();
        break;
      }
      default: return false;
    }
    return true;
  }

  // --- one request, and its confirmation ------------------------------------------------------------

  function onRequestKey(event) {
    var link = { a: "approve-link", r: "reject-link" }[event.key];
    var target = link && document.getElementById(link);
    if (!target) return false;
    target.click();
    return true;
  }

  function onConfirmKey(event) {
    if (event.key !== "Enter" || (event.target.closest && event.target.closest("a, button, input[type=submit]"))) return false;
    var confirm = document.getElementById("confirm-decision");
    if (!confirm) return false;
    confirm.click();  // the page's own submit button: the same POST as a click
    return true;
  }

  if (confirmPage) hint("Enter confirms (outside the text boxes) · ? shows the keys");
  if (requestPage) hint("a approve… · r reject… · ? shows the keys");
  if ((confirmPage || requestPage) && !document.getElementById("queue-keys-help")) {
    var help = document.createElement("p");
    help.className = "desk-keys-help";
    help.id = "queue-keys-help";
    help.hidden = true;
    help.textContent = confirmPage
      ? "On this confirmation page, Enter does what the “Yes” button does; in a text box it starts a new line. "
        + "Tab moves between the fields and buttons."
      : "a opens the approval's confirmation page, r the rejection's; nothing is decided until you confirm there.";
    document.getElementById("queue-keys-hint").insertAdjacentElement("afterend", help);
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.altKey || event.metaKey || event.defaultPrevented) return;
    if (event.key === "Escape") { toggleHelp(false); return; }
    if (typing(event.target)) return;
    var handled;
    if (event.key === "?") { toggleHelp(); handled = true; }
    else if (queue) handled = onQueueKey(event);
    else if (confirmPage) handled = onConfirmKey(event);
    else handled = onRequestKey(event);
    if (handled) event.preventDefault();
  });
})();

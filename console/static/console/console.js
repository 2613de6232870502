/* Warden console: keeps the server-rendered session page live over the websocket.
 *
 * The database is the truth and the socket a doorbell. Every run section carries the last
 * event seq it shows (data-last-seq); the page subscribes with those numbers, the server
 * sends what is newer, and events at or below a run's seq are ignored. Streamed text is
 * reconciled by character offset (and the delta's `so_far`), so a page that joins or
 * reloads mid-stream shows every character exactly once. A run the page does not know yet,
 * or one that just ended, is (re)rendered by the server (GET /console/runs/<id>/).
 */
(function () {
  "use strict";

  var TERMINAL = { completed: true, failed: true, cancelled: true };
  // What a tool call's status is called on screen (as console/presenters.py says).
  var TOOL_STATUS_LABELS = {
    pending: "waiting", running: "in progress", succeeded: "done", failed: "failed", unknown: "checking", cancelled: "not done",
  };
  // A run's one badge (as presenters.run_badge_label says): what it does, waits for, or came to.
  var PHASE_LABELS = { preparing_context: "preparing", calling_model: "thinking", executing_tools: "running tools", waiting_worker: "queued" };
  var WAIT_LABELS = {
    waiting_input: "waiting for your answer", approval: "waiting for approval", retry_backoff: "retrying shortly",
    reconciliation: "checking the outcome", frozen: "paused by a freeze",
  };
  var OUTCOME_LABELS = { applied: "done", not_applied: "not done", rejected: "declined", expired: "expired" };
  var ASK_USER = "ask_user";
  var announcer = document.querySelector('[data-role="announcer"]');
  var layout = document.querySelector("[data-states-url]");
  setUpSidebar();
  if (layout) {
    // The sidebar's badges of other sessions: asked for now and then; this page's own session
    // follows its socket (setStatus).
    setInterval(refreshSessionBadges, 15000);
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") refreshSessionBadges();
    });
  }

  var configEl = document.getElementById("console-config");
  if (!configEl) return;
  var cfg = JSON.parse(configEl.textContent);
  var ZERO = "00000000-0000-0000-0000-000000000000";
  var runsBox = document.querySelector('[data-role="runs"]');
  var composer = document.querySelector('[data-role="composer"]');
  var connEl = document.querySelector('[data-role="connection"]');
  var errorEl = document.querySelector('[data-role="console-error"]');
  var runs = new Map();
  var socket = null;
  var attempts = 0;
  var refCounter = 0;
  var pendingRefs = {};

  // --- small DOM helpers --------------------------------------------------------------------

  function make(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function role(root, name) {
    return root.querySelector('[data-role="' + name + '"]');
  }

  function jsonText(value, compact) {
    if (value === null || value === undefined || value === "") return "";
    return compact ? JSON.stringify(value) : JSON.stringify(value, null, 2);
  }

  function csrfToken() {
    var input = document.querySelector('input[name="csrfmiddlewaretoken"]');
    return input ? input.value : "";
  }

  function urlFor(template, id) {
    return template.replace(ZERO, id);
  }

  function badgeLabel(p) {
    if (p.status === "running") return PHASE_LABELS[p.phase] || "running";
    if (p.status === "waiting") return WAIT_LABELS[p.wait_reason] || "waiting";
    if (p.status === "completed") return OUTCOME_LABELS[p.outcome] || "completed";
    return p.status || "";
  }

  function showError(message) {
    if (!errorEl) return;
    errorEl.textContent = message || "";
    errorEl.hidden = !message;
  }

  function setConnection(state, label) {
    if (!connEl) return;
    connEl.dataset.state = state;
    connEl.textContent = label;
  }

  // --- the sidebar, and what is read out -------------------------------------------------------

  function announce(text) {
    if (!announcer || !text) return;
    announcer.textContent = "";
    // A fresh text node each time, so the same words are announced again.
    setTimeout(function () { announcer.textContent = text; }, 50);
  }

  function setUpSidebar() {
    var sidebar = document.querySelector('[data-role="sidebar"]');
    var toggle = sidebar && sidebar.querySelector('[data-role="sidebar-toggle"]');
    if (!toggle) return;
    toggle.addEventListener("click", function () {
      var open = !sidebar.classList.contains("open");
      sidebar.classList.toggle("open", open);
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  function setSessionBadge(sessionId, status) {
    var li = document.querySelector('[data-role="session-list"] li[data-session="' + sessionId + '"]');
    var badge = li && li.querySelector('[data-role="session-badge"]');
    if (!badge) return;
    var active = status && !TERMINAL[status];
    badge.hidden = !active;
    badge.textContent = active ? status : "";
    badge.className = "badge status-" + (active ? status : "idle");
  }

  function refreshSessionBadges() {
    fetch(layout.dataset.statesUrl, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) {
        if (!body) return;
        Object.keys(body.sessions).forEach(function (id) { setSessionBadge(id, body.sessions[id]); });
      })
      .catch(function () {});
  }

  // --- run state ----------------------------------------------------------------------------

  function adopt(section, previous) {
    var run = {
      id: section.dataset.runId,
      el: section,
      lastSeq: Number(section.dataset.lastSeq) || 0,
      status: section.dataset.status,
      steps: new Map(),
      loading: false,
      buffer: [],
      timelineTimer: null,
    };
    section.querySelectorAll('li.step[data-kind="model"]').forEach(function (li) {
      var index = Number(li.dataset.step);
      var textEl = role(li, "text");
      var step = { el: li, textEl: textEl, text: textEl.textContent, final: !li.classList.contains("step-running"), stash: [] };
      var before = previous && previous.steps.get(index);
      // The server's text of a running step is the last heartbeat's; what deltas showed may be newer.
      if (before && !step.final && before.text.length > step.text.length) {
        step.text = before.text;
        textEl.textContent = step.text;
      }
      run.steps.set(index, step);
    });
    return run;
  }

  function afterMap() {
    var after = {};
    runs.forEach(function (run, id) {
      after[id] = run.lastSeq;
    });
    return after;
  }

  function loadRun(runId, run) {
    if (!run) {
      run = { id: runId, el: null, lastSeq: 0, steps: new Map(), buffer: [], loading: false };
      runs.set(runId, run);
    }
    if (run.loading) return run;
    run.loading = true;
    fetch(urlFor(cfg.run_url, runId), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var template = document.createElement("template");
        template.innerHTML = html;
        var section = template.content.querySelector("section.run");
        var pending = template.content.querySelector('[data-role="pending-inputs"]');
        if (run.el) {
          run.el.replaceWith(section);
        } else {
          var hint = role(runsBox, "no-runs");
          if (hint) hint.remove();
          runsBox.appendChild(section);
        }
        section.querySelectorAll("figure.timeline").forEach(fitLabels);
        var fresh = adopt(section, run);
        if (fresh.lastSeq < run.lastSeq) {
          // Never go back: what the page already applied stays applied.
          fresh.lastSeq = run.lastSeq;
          section.dataset.lastSeq = String(run.lastSeq);
        }
        var buffered = run.buffer;
        Object.assign(run, fresh, { loading: false, buffer: [] });
        if (pending) replacePending(pending);
        heldReplace(template.content);
        buffered.forEach(function (item) {
          if (item[0] === "events") applyEvents(run, item[1]);
          else applyDelta(run, item[1]);
        });
        updateComposer();
      })
      .catch(function () {
        run.loading = false;
        setTimeout(function () {
          loadRun(runId, run);
        }, 2000);
      });
    return run;
  }

  function replacePending(fresh) {
    var current = document.querySelector('main [data-role="pending-inputs"]');
    if (current) current.replaceWith(fresh);
  }

  // --- lifecycle events ----------------------------------------------------------------------

  function applyEvents(run, events) {
    if (run.loading) {
      run.buffer.push(["events", events]);
      return;
    }
    for (var i = 0; i < events.length; i++) {
      var event = events[i];
      if (event.seq <= run.lastSeq) continue; // already shown
      var outcome = applyEvent(run, event);
      run.lastSeq = event.seq;
      run.el.dataset.lastSeq = String(event.seq);
      if (outcome === "ended") {
        // The run ended: let the server render its final state (effects, timeline, texts).
        loadRun(run.id, run);
        if (i + 1 < events.length) run.buffer.push(["events", events.slice(i + 1)]);
        return;
      }
    }
  }

  function applyEvent(run, event) {
    var p = event.payload || {};
    switch (event.type) {
      case "run_status":
        setStatus(run, p);
        if (TERMINAL[p.status]) return "ended";
        scheduleTimeline(run);
        break;
      case "step_started":
        ensureStep(run, p.step, p.kind);
        break;
      case "step_completed":
        completeStep(run, p);
        break;
      case "step_discarded":
        discardStep(run, p);
        break;
      case "tool_call":
        upsertToolCard(run, p);
        break;
      case "approval_requested":
      case "approval_decided":
      case "approval_expired":
      case "approval_withdrawn":
        upsertApproval(run, p);
        break;
      case "input_queued":
        addPending(p);
        break;
      case "input_classified":
        classifyPending(p);
        break;
      case "input_applied":
        removePending(p.pending_input);
        appendUserMessage(run, p.content);
        break;
      case "input_requested":
        appendQuestion(run, p.question, p.tool_call);
        break;
      case "input_answered":
        appendUserMessage(run, p.content);
        break;
      case "cancel_requested":
        cancelRequested(run, p);
        break;
    }
    return null;
  }

  function setStatus(run, p) {
    run.status = p.status;
    var section = run.el;
    section.dataset.status = p.status;
    section.dataset.phase = p.phase || "";
    section.dataset.waitReason = p.wait_reason || "";
    section.className = section.className.replace(/\bstatus-\S+/, "status-" + p.status);
    var badge = role(section, "status");
    badge.textContent = badgeLabel(p);
    badge.title = p.status;
    badge.className = "badge status-" + p.status + (p.outcome ? " outcome-" + p.outcome : "");
    // The detail beside the badge (until when a wait lasts) comes with the server's rendering.
    role(section, "state").textContent = "";
    setSessionBadge(cfg.session, p.status);
    announce("Run " + badgeLabel(p) + ".");
    updateComposer();
  }

  function scheduleTimeline(run) {
    clearTimeout(run.timelineTimer);
    run.timelineTimer = setTimeout(function () {
      fetch(urlFor(cfg.run_url, run.id), { credentials: "same-origin" })
        .then(function (response) {
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          if (!html || run.loading) return;
          var template = document.createElement("template");
          template.innerHTML = html;
          var fresh = template.content.querySelector('[data-role="timeline"]');
          var current = role(run.el, "timeline");
          if (fresh && current) {
            current.replaceWith(fresh);
            fitLabels(fresh);
          }
        })
        .catch(function () {});
    }, 400);
  }

  function stepElement(run, index) {
    return run.el.querySelector('li.step[data-step="' + index + '"]');
  }

  function ensureStep(run, index, kind) {
    if (kind === "model" && run.steps.has(index)) return run.steps.get(index);
    var li = stepElement(run, index);
    if (!li) {
      li = make("li", "step " + kind + " step-running");
      li.dataset.step = String(index);
      li.dataset.kind = kind;
      if (kind === "model") {
        var text = make("div", "bubble assistant");
        text.dataset.role = "text";
        text.setAttribute("aria-live", "polite");
        text.setAttribute("aria-busy", "true");
        var drafts = make("div", "drafts");
        drafts.dataset.role = "drafts";
        li.append(text, drafts);
      }
      role(run.el, "items").appendChild(li);
    }
    if (kind !== "model") return li;
    var step = { el: li, textEl: role(li, "text"), text: role(li, "text").textContent, final: false, stash: [] };
    run.steps.set(index, step);
    return step;
  }

  function markStep(li, status) {
    li.className = li.className.replace(/\bstep-(running|completed|discarded|failed)\b/g, "").trim() + " step-" + status;
  }

  function completeStep(run, p) {
    if (p.kind === "model") {
      var step = ensureStep(run, p.step, "model");
      step.text = p.text || "";
      step.textEl.textContent = step.text;
      step.final = true;
      step.textEl.setAttribute("aria-busy", "false");
      role(step.el, "drafts").textContent = "";
      markStep(step.el, "completed");
    } else {
      markStep(ensureStep(run, p.step, p.kind || "tools"), "completed");
    }
  }

  function discardStep(run, p) {
    var li = stepElement(run, p.step);
    if (!li) return;
    var step = run.steps.get(p.step);
    if (step) {
      step.final = true;
      step.textEl.setAttribute("aria-busy", "false");
    }
    if (!cfg.viewer.desk_view) {
      // A turn thrown away is the run-time's business: the customer's page just drops it.
      li.remove();
      return;
    }
    markStep(li, "discarded");
    var note = role(li, "discarded") || make("p", "discarded");
    note.dataset.role = "discarded";
    note.textContent = "Discarded: " + (p.reason || "");
    li.appendChild(note);
  }

  function appendUserMessage(run, content) {
    var li = make("li", "msg user");
    li.appendChild(make("div", "bubble", content));
    role(run.el, "items").appendChild(li);
  }

  function appendQuestion(run, question, toolCall) {
    // The question's card (the ask_user call) says it already.
    if (toolCall && run.el.querySelector('[data-tool-call="' + toolCall + '"]')) return;
    var li = make("li", "msg assistant question");
    li.appendChild(make("div", "bubble", question));
    role(run.el, "items").appendChild(li);
  }

  function cancelRequested(run, p) {
    var by = "";
    if (p.by && cfg.viewer.desk_view) by = " by " + p.by;
    else if (p.by && p.by === cfg.viewer.username) by = " by you";
    else if (p.by) by = " by an operator";
    role(run.el, "cancel-note").textContent = "cancel requested" + by + (p.reason ? " (" + p.reason + ")" : "") + "…";
    var button = role(run.el, "cancel");
    if (button) button.disabled = true;
  }

  // --- the timeline's clock -------------------------------------------------------------------
  /* An active run's timeline keeps moving between the server's renderings (which come with each
   * status change): its bars carry their begin and end in seconds (an open end: still going), and
   * every second they are placed again on an axis that reaches now, so the "so far" figure grows
   * while a run waits. The server's clock is the reference (data-now-ms, the moment of rendering). */

  function durationText(seconds) {
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 60) return seconds.toFixed(1) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " m " + String(Math.floor(seconds % 60)).padStart(2, "0") + " s";
    return Math.floor(seconds / 3600) + " h " + String(Math.floor((seconds % 3600) / 60)).padStart(2, "0") + " m";
  }

  /* A bar's words show only when they fit in it (else its tooltip says them). Step numbers show
   * all or none: a row reading "2 4 6" would look like steps went missing. */
  function fitLabels(figure) {
    var stepTexts = [];
    var stepsFit = true;
    figure.querySelectorAll("svg.bar").forEach(function (bar) {
      var text = bar.querySelector("text");
      if (!text) return;
      text.removeAttribute("visibility");
      var fits = text.getComputedTextLength() + 5 <= bar.width.baseVal.value;
      if (/(^|\s)step-/.test(bar.getAttribute("class"))) {
        stepTexts.push(text);
        if (!fits) stepsFit = false;
      } else if (!fits) {
        text.setAttribute("visibility", "hidden");
      }
    });
    stepTexts.forEach(function (text) {
      if (!stepsFit) text.setAttribute("visibility", "hidden");
    });
    figure.dataset.fitted = "1";
  }

  function timelineTick() {
    document.querySelectorAll('figure.timeline:not([data-fitted="1"])').forEach(fitLabels);
    document.querySelectorAll('figure.timeline[data-ongoing="1"]').forEach(function (figure) {
      if (!figure.dataset.skew) figure.dataset.skew = String(Date.now() - Number(figure.dataset.nowMs));
      var now = Date.now() - Number(figure.dataset.skew);
      var total = Math.max((now - Number(figure.dataset.startMs)) / 1000, Number(figure.dataset.total) || 0, 0.001);
      figure.querySelectorAll("svg.bar").forEach(function (bar) {
        var begin = Math.min(Number(bar.dataset.begin) || 0, total);
        var end = bar.dataset.end === "" ? total : Math.min(Number(bar.dataset.end), total);
        bar.setAttribute("x", (begin / total * 100).toFixed(2) + "%");
        bar.setAttribute("width", Math.max((end - begin) / total * 100, 0.5).toFixed(2) + "%");
      });
      figure.querySelectorAll("text.tick").forEach(function (tick) {
        tick.textContent = durationText(total * Number(tick.dataset.fraction));
      });
      var label = figure.querySelector('[data-role="timeline-total"]');
      if (label) label.textContent = durationText(total);
      var plot = figure.querySelector("svg.timeline-plot");
      if (plot) plot.setAttribute("aria-label", "Timeline of the run: " + durationText(total) + " so far");
      fitLabels(figure);
    });
  }

  setInterval(timelineTick, 1000);
  timelineTick();
  window.addEventListener("resize", function () {
    document.querySelectorAll("figure.timeline").forEach(fitLabels);
  });

  // --- tool calls and approvals ----------------------------------------------------------------

  function toolLabel(name) {
    var text = String(name || "").replace(/_/g, " ").trim();
    return text.charAt(0).toUpperCase() + text.slice(1);
  }

  function upsertToolCard(run, p) {
    var card = run.el.querySelector('[data-tool-call="' + p.tool_call + '"]');
    if (!card) {
      card = buildToolCard(p);
      var tools = run.el.querySelectorAll('li.step[data-kind="tools"]');
      var container = tools.length ? tools[tools.length - 1] : role(run.el, "items");
      container.appendChild(card);
    }
    // The socket sends the card's badge and words (presenters.console_event).
    var label = p.status_label || TOOL_STATUS_LABELS[p.status] || p.status;
    var question = p.tool === ASK_USER;
    card.className = "tool-card status-" + p.status + (question ? " question-card" : "");
    card.setAttribute("aria-label", (question ? "Question for you" : toolLabel(p.tool)) + ": " + label);
    var badge = role(card, "tool-status");
    badge.textContent = label;
    badge.className = "badge status-" + p.status;
    role(card, "attempts").textContent = p.attempts > 1 ? p.attempts + " attempts" : "";
    role(card, "arguments").textContent = jsonText(p.arguments, true);
    role(card, "money").textContent = p.money || "";  // "9.00 EUR": the amount with its currency
    var result = jsonText(p.result);
    role(card, "result").textContent = result;
    role(card, "result-box").hidden = !result;
    // Plain words only (the event's `message`); codes and details are the desk's.
    role(card, "message").textContent = p.message || "";
    // An operator changed the request before approving it: the customer sees what it is for now.
    role(card, "edited").textContent = p.edited || "";
    role(card, "edited").hidden = !p.edited;
  }

  function buildToolCard(p) {
    var card = make("article", "tool-card");
    card.dataset.toolCall = p.tool_call;
    card.dataset.callId = p.tool_call_id || "";
    card.dataset.tool = p.tool;
    var question = p.tool === ASK_USER;
    var head = make("header");
    if (question) {
      // ask_user: a question for the customer to answer, not a look-up.
      head.append(make("span", "tool-label", "Question for you"));
    } else {
      head.append(
        make("span", "tool-label", toolLabel(p.tool)),
        make("code", "tool-name", p.tool),
        make("span", "effect effect-" + p.effect, p.effect === "write" ? "changes something" : "look-up")
      );
    }
    var money = make("span", "money");
    money.dataset.role = "money";
    head.append(money);
    var badge = make("span", "badge");
    badge.dataset.role = "tool-status";
    var attempts = make("span", "attempts");
    attempts.dataset.role = "attempts";
    head.append(badge, attempts);
    var message = make("p", "tool-message");
    message.dataset.role = "message";
    var edited = make("p", "tool-edited");
    edited.dataset.role = "edited";
    edited.hidden = true;
    var details = make("details", "tool-details");
    details.appendChild(make("summary", null, "Details"));
    var args = make("p", "arguments", "Arguments ");
    var code = make("code");
    code.dataset.role = "arguments";
    args.appendChild(code);
    var resultBox = make("div");
    resultBox.dataset.role = "result-box";
    resultBox.hidden = true;
    resultBox.appendChild(make("p", "arguments", "Result"));
    var pre = make("pre");
    pre.dataset.role = "result";
    resultBox.appendChild(pre);
    details.append(args, resultBox);
    if (question) details.hidden = true;
    var approvals = make("div", "card-approvals");
    approvals.dataset.role = "card-approvals";
    card.append(head);
    if (question) {
      var asked = make("p", "question", (p.arguments && p.arguments.question) || "");
      asked.dataset.role = "question";
      card.append(asked);
    }
    card.append(message, edited, details, approvals);
    return card;
  }

  /* How a decided request reads (as presenters.approval_state_text says): the customer learns who
   * decided in general terms and the decider's message to them; an operator watching also sees
   * who and the note. (The server sends a customer no operator's note anyway.) */
  function approvalStateText(p) {
    if (p.status === "expired") return "Nobody approved it in time.";
    if (p.status === "withdrawn") return "Withdrawn: the request ended before anyone decided.";
    var verb = { approved: "Approved", rejected: "Declined" }[p.status] || p.status;
    var text;
    if (cfg.viewer.desk_view) text = verb + " by " + (p.decided_by || "nobody") + (p.note ? ": " + p.note : "");
    else if (p.decided_by && p.decided_by === cfg.viewer.username) text = verb + " by you" + (p.note ? ": " + p.note : "");
    else text = verb + " by " + (p.policy === "operator" ? "an operator" : "the session owner");
    text = text.replace(/\.$/, "") + ".";
    return p.customer_message ? text + " \u201c" + p.customer_message + "\u201d" : text;
  }

  function upsertApproval(run, p) {
    var node = run.el.querySelector('div.approval[data-approval="' + p.approval + '"]');
    if (!node) {
      // Shown on the card of the tool call it is about, if the page shows that card.
      var card = run.el.querySelector('[data-tool-call="' + p.tool_call + '"]');
      var box = card ? role(card, "card-approvals") : role(run.el, "approvals");
      node = make("div", "approval");
      node.dataset.approval = p.approval;
      node.dataset.policy = p.policy;
      var ask = make("p", "approval-ask", (p.policy === "user" ? "Your confirmation is" : "An operator's approval is") + " needed to ");
      ask.appendChild(make("b", null, toolLabel(p.tool || (card ? card.querySelector(".tool-name").textContent : "run a tool")).toLowerCase()));
      ask.appendChild(document.createTextNode("."));
      var state = make("div");
      state.dataset.role = "approval-state";
      node.append(ask, state);
      box.appendChild(node);
    }
    node.className = "approval status-" + p.status + " policy-" + p.policy;
    var askEl = node.querySelector(".approval-ask");
    var named = askEl.querySelector("b");
    var what = named ? named.textContent : toolLabel(p.tool || "a tool").toLowerCase();
    askEl.textContent = (p.policy === "user" ? "Your confirmation" : "An operator's approval") +
      (p.status === "pending" ? " is needed" : " was asked for") + " to ";
    askEl.append(make("b", null, what), document.createTextNode("."));
    var stateEl = role(node, "approval-state");
    stateEl.textContent = "";
    if (p.status === "pending") {
      stateEl.appendChild(pendingApprovalBody(p));
      announce(p.policy === "user" ? "Your confirmation is needed." : "Waiting for an operator's approval.");
    } else {
      var text = approvalStateText(p);
      stateEl.appendChild(make("p", "decided", text));
      announce(text);
    }
  }

  function pendingApprovalBody(p) {
    if (p.policy === "user" && cfg.viewer.is_owner) {
      var form = make("form", "decide-form");
      form.method = "post";
      form.action = urlFor(cfg.approval_decide_url, p.approval);
      form.dataset.approval = p.approval;
      var token = make("input");
      token.type = "hidden";
      token.name = "csrfmiddlewaretoken";
      token.value = csrfToken();
      form.append(token, make("p", null, "Do you confirm?"));
      [["approve", "Confirm", "primary"], ["reject", "Decline", "danger"]].forEach(function (spec) {
        var button = make("button", spec[2], spec[1]);
        button.name = "decision";
        button.value = spec[0];
        form.appendChild(button);
      });
      return form;
    }
    if (p.policy === "operator") {
      var waiting = make("p", "waiting-operator", "Waiting for an operator to approve this.");
      if (cfg.viewer.admin_approvals_url) {
        waiting.appendChild(document.createTextNode(" "));
        var link = make("a", null, "Open the approval queue");
        link.href = cfg.viewer.admin_approvals_url;
        waiting.appendChild(link);
      }
      return waiting;
    }
    return make("p", "waiting-operator", "Waiting for the session's owner to confirm.");
  }

  // --- queued input -------------------------------------------------------------------------------

  function pendingList() {
    return document.querySelector('main [data-role="pending-inputs"]');
  }

  function addPending(p) {
    var list = pendingList();
    if (!list || list.querySelector('[data-pending="' + p.pending_input + '"]')) return;
    var li = make("li");
    li.dataset.pending = String(p.pending_input);
    var badge = make("span", "badge", "queued · ");
    var mode = make("span", null, p.mode);
    mode.dataset.role = "mode";
    badge.appendChild(mode);
    li.append(badge, document.createTextNode(" " + p.content));
    list.appendChild(li);
  }

  function classifyPending(p) {
    var li = document.querySelector('[data-pending="' + p.pending_input + '"]');
    if (li) role(li, "mode").textContent = p.mode;
  }

  function removePending(id) {
    var li = document.querySelector('[data-pending="' + id + '"]');
    if (li) li.remove();
  }

  // --- streamed text ---------------------------------------------------------------------------------

  function applyDelta(run, delta) {
    if (run.loading) {
      run.buffer.push(["delta", delta]);
      return;
    }
    if (TERMINAL[run.status]) return;
    if (delta.kind === "text_delta") applyText(run, delta);
    else if (delta.kind === "tool_call_delta") applyDraftCall(run, delta);
  }

  /* Text deltas carry the character offset they start at. What the page already has is
   * skipped, a piece beyond the end waits (stash) until the gap is filled, and `so_far` —
   * the whole text when short — repairs any gap at once. */
  function applyText(run, delta) {
    var step = ensureStep(run, delta.step, "model");
    if (step.final) return;
    var text = step.text;
    if (typeof delta.so_far === "string" && delta.so_far.length > text.length) {
      text = delta.so_far;
    } else {
      step.stash.push([delta.offset, delta.text]);
    }
    var progressed = true;
    while (progressed) {
      progressed = false;
      step.stash = step.stash.filter(function (piece) {
        var offset = piece[0];
        var chunk = piece[1];
        if (offset + chunk.length <= text.length) return false; // nothing new in it
        if (offset > text.length) return true; // a gap before it: keep waiting
        text += chunk.slice(text.length - offset);
        progressed = true;
        return false;
      });
    }
    if (text !== step.text) {
      step.text = text;
      step.textEl.textContent = text;
    }
  }

  function applyDraftCall(run, delta) {
    var step = ensureStep(run, delta.step, "model");
    if (step.final) return;
    var drafts = role(step.el, "drafts");
    var draft = drafts.querySelector('[data-draft="' + delta.index + '"]');
    if (!draft) {
      draft = make("div", "draft-call");
      draft.dataset.draft = String(delta.index);
      draft.append(make("span", "tool-name"), make("code"));
      drafts.appendChild(draft);
    }
    draft.querySelector(".tool-name").textContent = "preparing " + (delta.name || "a tool call") + " ";
    // Fragments carry their offset in the arguments: what the page has is skipped; one past the
    // end (a missed doorbell) is dropped — the tool-call card shows the whole arguments anyway.
    var code = draft.querySelector("code");
    var have = code.textContent;
    var args = delta.arguments || "";
    var offset = typeof delta.offset === "number" ? delta.offset : have.length;
    if (offset <= have.length && offset + args.length > have.length) {
      code.textContent = have + args.slice(have.length - offset);
    }
  }

  // --- the socket -------------------------------------------------------------------------------------

  function runFor(runId) {
    return runs.get(runId) || loadRun(runId);
  }

  function handle(message) {
    switch (message.type) {
      case "events":
        applyEvents(runFor(message.run_id), message.events);
        break;
      case "delta":
        applyDelta(runFor(message.run_id), message.delta);
        break;
      case "stream":
        applyDelta(runFor(message.run_id), { kind: "text_delta", step: message.step, offset: 0, text: message.text });
        break;
      case "subscribed":
        setConnection("live", "live");
        break;
      case "error":
        // The refusal's code is for an operator; the customer reads its words.
        showError(cfg.viewer.desk_view ? message.message + " (" + message.code + ")" : message.message);
        settle(message.ref, false);
        break;
      default:
        settle(message.ref, true);
    }
  }

  function settle(ref, ok) {
    var done = ref && pendingRefs[ref];
    if (!done) return;
    delete pendingRefs[ref];
    done(ok);
  }

  function send(payload, onDone) {
    if (!socket || socket.readyState !== WebSocket.OPEN) return false;
    payload.ref = "r" + ++refCounter;
    if (onDone) pendingRefs[payload.ref] = onDone;
    socket.send(JSON.stringify(payload));
    return true;
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + cfg.ws_path);
    socket.onopen = function () {
      attempts = 0;
      send({ action: "subscribe", session: cfg.session, after: afterMap() });
    };
    socket.onmessage = function (event) {
      handle(JSON.parse(event.data));
    };
    socket.onclose = function () {
      setConnection("reconnecting", "reconnecting…");
      var delay = Math.min(10000, 500 * Math.pow(2, attempts++));
      setTimeout(connect, delay);
    };
  }

  // --- cancelling, after saying what it would leave done and stop (console/cancel_preview.py) -------
  /* "Cancel run" is a GET of the confirmation; here it opens inside the run instead of a page of
   * its own. "Yes" cancels over the socket (or posts the form); "No" closes it. */

  function cancelConfirmOpen(form) {
    var section = form.closest("section.run");
    if (!section) return false;
    var open = role(section, "cancel-confirm");
    if (open) {
      cancelConfirmFocus(open);
      return true;
    }
    fetch(form.action + "?fragment=1", { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var template = document.createElement("template");
        template.innerHTML = html;
        var panel = template.content.querySelector('[data-role="cancel-confirm"]');
        var current = document.body.contains(section) ? section : document.getElementById(section.id);
        if (!panel || !current || role(current, "cancel-confirm")) return;
        current.querySelector(".run-head").after(panel);
        cancelConfirmFocus(panel);
      })
      .catch(function () {
        window.location.href = form.action; // the confirmation as a page of its own
      });
    return true;
  }

  function cancelConfirmFocus(panel) {
    var first = role(panel, "cancel-no") || role(panel, "cancel-yes");
    if (first) first.focus();
  }

  function cancelConfirmed(form) {
    var panel = form.closest('[data-role="cancel-confirm"]');
    var buttons = form.querySelectorAll("button");
    var sent = send({ action: "cancel", run: form.dataset.run }, function (ok) {
      if (ok && panel) panel.remove();
      else buttons.forEach(function (b) { b.disabled = false; });
    });
    if (sent) buttons.forEach(function (b) { b.disabled = true; });
    return sent;
  }

  document.addEventListener("click", function (event) {
    var no = event.target.closest && event.target.closest('section.run [data-role="cancel-no"]');
    if (!no) return;
    event.preventDefault();
    var section = no.closest("section.run");
    no.closest('[data-role="cancel-confirm"]').remove();
    var button = role(section, "cancel");
    if (button && !button.disabled) button.focus();
  });

  // --- input held from a cancelled run: "Send as a new request" or "Drop it" -------------------------

  function heldReplace(fragment) {
    var fresh = fragment.querySelector('[data-role="held-inputs"]');
    var current = document.querySelector('main [data-role="held-inputs"]');
    if (fresh && current) current.replaceWith(fresh);
  }

  function heldChoose(form, submitter) {
    var body = new FormData(form);
    body.set("choice", submitter ? submitter.value : "send");
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.action, { method: "POST", body: body, credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        return response.json().then(function (data) {
          if (!response.ok) throw new Error(data.message ? data.message + " (" + data.code + ")" : "HTTP " + response.status);
          return data;
        });
      })
      .then(function (data) {
        var item = form.closest("[data-held]");
        if (item) item.remove();
        showError("");
        announce(data.choice === "drop" ? "Dropped." : "Sent as a new request.");
      })
      .catch(function (error) {
        showError(error.message);
        buttons.forEach(function (b) { b.disabled = false; });
      });
    return true; // answered here, whatever the socket's state
  }

  // --- the composer and buttons --------------------------------------------------------------------

  function updateComposer() {
    if (!composer) return;
    var busy = false;
    runs.forEach(function (run) {
      if (run.status && !TERMINAL[run.status]) busy = true;
    });
    composer.classList.toggle("busy", busy);
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var sent = false;
    if (form === composer) {
      var textarea = form.querySelector("textarea");
      var checked = form.querySelector('input[name="mode"]:checked');
      var button = role(form, "send");
      sent = send(
        { action: "post", session: cfg.session, content: textarea.value, mode: composer.classList.contains("busy") && checked ? checked.value : "auto" },
        function (ok) {
          button.disabled = false;
          if (ok) {
            textarea.value = "";
            showError("");
            textarea.focus();
          }
        }
      );
      if (sent) button.disabled = true;
    } else if (form.classList.contains("cancel-form")) {
      sent = cancelConfirmOpen(form);
    } else if (form.classList.contains("cancel-confirm-form")) {
      sent = cancelConfirmed(form);
    } else if (form.classList.contains("held-form")) {
      sent = heldChoose(form, event.submitter);
    } else if (form.classList.contains("decide-form")) {
      var decision = event.submitter ? event.submitter.value : "approve";
      sent = send({ action: "decide", approval: form.dataset.approval, decision: decision }, function (ok) {
        if (!ok) form.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
      });
      if (sent) form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    }
    // Without a live socket the form posts the ordinary way (the page reloads).
    if (sent) event.preventDefault();
  });

  if (composer) {
    composer.querySelector("textarea").addEventListener("keydown", function (event) {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        composer.requestSubmit();
      }
    });
  }

  document.querySelectorAll("section.run").forEach(function (section) {
    var run = adopt(section, null);
    runs.set(run.id, run);
  });
  updateComposer();
  connect();
})();

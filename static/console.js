/* The console's only script besides htmx. No build step: plain ES2017.
 * - pollAllowed(): polls never redraw a fragment under someone typing in one of its forms,
 *   and a hidden tab does not poll at all;
 * - flash messages can be dismissed;
 * - when the gateway cannot be reached, say so instead of failing silently, and stop saying
 *   so once a poll gets through again;
 * - copy buttons, the phone's nav menu, keyboard shortcuts (? lists them), and the triage
 *   filters remembered for the way back from an effect;
 * - the triage filters behind one button on a phone, and skip links that move focus. */
(function () {
  "use strict";

  window.pollAllowed = function (element) {
    if (document.visibilityState !== "visible") return false;
    if (!element) return true;
    var active = document.activeElement;
    if (active && element.contains(active) && active.closest("form")) return false;
    // An action form someone opened, or a field someone typed in: keep it in place.
    if (element.querySelector("details[open]")) return false;
    // Changed from what the server drew (a box ticked, a word typed); radios and checkboxes
    // carry a value whether or not anyone touched them, so they count when (un)checked.
    var fields = element.querySelectorAll("form input:not([type=hidden]), form textarea");
    for (var i = 0; i < fields.length; i++) {
      var input = fields[i];
      if (input.type === "checkbox" || input.type === "radio") {
        if (input.checked !== input.defaultChecked) return false;
      } else if (input.value !== input.defaultValue) {
        return false;
      }
    }
    return true;
  };

  // Polling fragments carry data-poll. A poll that pollAllowed() refuses is dropped before
  // it is sent (a cancelled htmx:beforeRequest), so no trigger filter has to be evaluated:
  // htmx runs with allowEval off under the Content-Security-Policy.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var element = event.detail.elt;
    if (element && element.hasAttribute("data-poll") && !window.pollAllowed(element)) {
      event.preventDefault();
    }
  });

  document.addEventListener("click", function (event) {
    var button = event.target.closest(".flash-close");
    if (button) button.closest(".flash").remove();
    // Copy buttons name the element whose text they copy (data-copy="<id>"); without a
    // clipboard (plain http) the text is selected instead, for Ctrl+C.
    var copy = event.target.closest("button[data-copy]");
    if (copy) {
      var source = document.getElementById(copy.getAttribute("data-copy"));
      if (!source) return;
      var text = source.textContent.trim();
      var done = function () { copy.textContent = "Copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () { selectText(source); });
      } else {
        selectText(source);
      }
    }
  });

  function selectText(element) {
    var range = document.createRange();
    range.selectNodeContents(element);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function say(text) {
    var region = document.getElementById("flash");
    if (!region) return;
    var message = document.createElement("p");
    message.className = "flash flash-error";
    message.setAttribute("role", "alert");
    message.textContent = text;
    region.replaceChildren(message);
  }

  document.addEventListener("htmx:sendError", function () {
    say("Lost contact with the gateway; the page keeps retrying. An action you just sent " +
        "may or may not have arrived: reload and check before repeating it.");
    var lost = document.querySelector("#flash .flash-error");
    if (lost) lost.setAttribute("data-lost", "");
  });
  // Contact is back as soon as any request (a poll) gets an answer: the warning goes.
  document.addEventListener("htmx:afterRequest", function (event) {
    var xhr = event.detail.xhr;
    if (xhr && xhr.status > 0 && xhr.status < 500) {
      document.querySelectorAll("#flash [data-lost]").forEach(function (node) { node.remove(); });
    }
  });
  // Good news clears itself; errors stay until read and dismissed.
  function expireFlashes() {
    document.querySelectorAll("#flash .flash-success:not([data-expiring]), #flash .flash-info:not([data-expiring])")
      .forEach(function (node) {
        node.setAttribute("data-expiring", "");
        setTimeout(function () { node.remove(); }, 8000);
      });
  }
  document.addEventListener("DOMContentLoaded", expireFlashes);
  document.addEventListener("htmx:afterSettle", expireFlashes);
  document.addEventListener("htmx:responseError", function (event) {
    say("The gateway failed to answer (HTTP " + event.detail.xhr.status + "). " +
        "Reload to see the current state before repeating an action.");
  });

  // --- the phone's nav menu: hidden behind a button only when this script runs -------------
  document.documentElement.classList.add("js");
  document.addEventListener("click", function (event) {
    var button = event.target.closest(".menu-button");
    if (!button) return;
    var nav = document.getElementById(button.getAttribute("aria-controls"));
    var open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", open ? "true" : "false");
    if (nav) nav.classList.toggle("open", open);
  });

  // --- filters kept when going back to triage from an effect ------------------------------
  function rememberTriage() {
    var main = document.getElementById("main");
    if (main && main.getAttribute("data-view") === "triage") {
      try { sessionStorage.setItem("triage-query", location.search); } catch (e) { /* private mode */ }
    }
  }
  function restoreTriageLinks() {
    var query = "";
    try { query = sessionStorage.getItem("triage-query") || ""; } catch (e) { return; }
    if (!query) return;
    document.querySelectorAll("a[data-triage-link]").forEach(function (link) {
      link.setAttribute("href", link.getAttribute("href").split("?")[0] + query);
    });
  }
  document.addEventListener("DOMContentLoaded", function () { rememberTriage(); restoreTriageLinks(); });
  document.addEventListener("htmx:pushedIntoHistory", rememberTriage);
  document.addEventListener("htmx:afterSettle", restoreTriageLinks);

  // --- keyboard: / search, j/k/Enter in triage, r reconcile, ? the list ---------------------
  var selected = -1;
  function rows() { return document.querySelectorAll("tr[data-effect]"); }
  function select(index) {
    var all = rows();
    if (!all.length) return;
    selected = Math.max(0, Math.min(index, all.length - 1));
    all.forEach(function (row, i) { row.classList.toggle("selected", i === selected); });
    var link = all[selected].querySelector("a");
    if (link) link.focus();
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var target = event.target;
    if (target.closest("input, textarea, select, [contenteditable]")) return;
    var dialog = document.getElementById("shortcuts");
    if (event.key === "/") {
      var box = document.getElementById("search-q");
      if (box) { event.preventDefault(); box.focus(); box.select(); }
    } else if (event.key === "?") {
      if (dialog && !dialog.open) { event.preventDefault(); dialog.showModal(); }
    } else if (event.key === "j" || event.key === "k") {
      if (!rows().length) return;
      event.preventDefault();
      var current = Array.prototype.indexOf.call(rows(), document.activeElement.closest("tr[data-effect]"));
      if (current >= 0) selected = current;
      select(selected < 0 ? 0 : selected + (event.key === "j" ? 1 : -1));
    } else if (event.key === "r") {
      var reconcile = document.querySelector("form[action$='/reconcile'] button[type=submit]");
      if (reconcile) { event.preventDefault(); reconcile.click(); }
    }
  });

  // --- triage on a phone: the filters open behind one button; skip links focus their target --
  document.addEventListener("click", function (event) {
    var button = event.target.closest(".filters-button");
    if (button) {
      var form = document.getElementById(button.getAttribute("aria-controls"));
      var open = button.getAttribute("aria-expanded") !== "true";
      button.setAttribute("aria-expanded", open ? "true" : "false");
      if (form) form.classList.toggle("open", open);
      return;
    }
    var skip = event.target.closest("a.skip-link[href^='#']");
    if (!skip) return;
    var target = document.getElementById(skip.getAttribute("href").slice(1));
    if (target) {
      event.preventDefault();
      target.focus();
      target.scrollIntoView({ block: "center" });
    }
  });

  // The triage poll redraws the count of effects that need a human: the title and the nav's
  // badge follow it.
  document.addEventListener("htmx:afterSettle", function () {
    var line = document.getElementById("needs-human");
    if (!line) return;
    var count = line.getAttribute("data-count");
    document.title = document.title.replace(/^Triage: \d+ needs? a human/,
      "Triage: " + count + (count === "1" ? " needs" : " need") + " a human");
    var badge = document.getElementById("triage-badge");
    if (badge && badge.firstChild && badge.firstChild.nodeType === 3) {
      badge.firstChild.nodeValue = count;
      badge.classList.toggle("count-zero", count === "0");
    }
  });

  // After an action replaced a fragment (the effect, a saga, a case card, a section of the
  // controls), put keyboard focus back at the new fragment's heading (the one that takes
  // focus: tabindex="-1"), so that a keyboard user does not land at the top of the page.
  document.addEventListener("htmx:afterSettle", function (event) {
    var config = event.detail.requestConfig;
    if (!config || config.verb !== "post") return;
    var target = event.detail.target;
    var fresh = target && target.id && document.getElementById(target.id);
    var heading = fresh && fresh.querySelector("h1[tabindex='-1'], h2[tabindex='-1'], h3[tabindex='-1']");
    if (heading) heading.focus({ preventScroll: true });
  });
})();

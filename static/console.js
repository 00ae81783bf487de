/* The console's only script besides htmx. No build step: plain ES2017.
 * - pollAllowed(): polls never redraw a fragment under someone typing in one of its forms,
 *   and a hidden tab does not poll at all;
 * - flash messages can be dismissed;
 * - when the gateway cannot be reached, say so instead of failing silently. */
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
  });
  document.addEventListener("htmx:responseError", function (event) {
    say("The gateway failed to answer (HTTP " + event.detail.xhr.status + "). " +
        "Reload to see the current state before repeating an action.");
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

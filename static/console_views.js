/* The theme, the saved views bar and the export links. Loaded in <head> without defer, so the
 * theme is set on <html> before the body is painted (no flash of the other theme); the rest
 * waits for the document. No build step: plain ES2017. The Content-Security-Policy allows no
 * inline script, hence this file.
 * - theme: "system" (the default: the operating system's light or dark), "light" or "dark",
 *   kept in this browser's localStorage and applied as <html data-theme>; static/
 *   console_views.css holds the palettes it selects;
 * - after htmx changed a page's filters (and pushed them into the address bar), the saved
 *   views forms and the export links carry the new ones. */
(function () {
  "use strict";

  var KEY = "console-theme";
  var root = document.documentElement;

  function stored() {
    try { return localStorage.getItem(KEY) || "system"; } catch (e) { return "system"; }
  }

  function apply(theme) {
    if (theme === "light" || theme === "dark") {
      root.setAttribute("data-theme", theme);
    } else {
      root.removeAttribute("data-theme");
    }
  }

  apply(stored());
  // The theme control (and the phone's menu) show only where scripts run.
  root.classList.add("js");

  document.addEventListener("DOMContentLoaded", function () {
    var choice = document.querySelector("[data-theme-choice]");
    if (choice) choice.value = stored();
    refreshQueries();
  });

  document.addEventListener("change", function (event) {
    var choice = event.target.closest("[data-theme-choice]");
    if (!choice) return;
    var theme = choice.value;
    try {
      if (theme === "system") localStorage.removeItem(KEY); else localStorage.setItem(KEY, theme);
    } catch (e) { /* private mode: this page only */ }
    apply(theme);
  });

  // Another tab changed the theme: follow it.
  window.addEventListener("storage", function (event) {
    if (event.key !== KEY) return;
    apply(stored());
    var choice = document.querySelector("[data-theme-choice]");
    if (choice) choice.value = stored();
  });

  // --- the saved views bar: the page's current filters, without its cursor -----------------
  function currentQuery() {
    var params = new URLSearchParams(location.search);
    params.delete("after");
    params.delete("since");
    return params.toString();
  }

  function refreshQueries() {
    if (!document.querySelector("[data-views-page]")) return;
    var query = currentQuery();
    document.querySelectorAll("input[data-current-query]").forEach(function (input) {
      input.value = query;
    });
    document.querySelectorAll("a[data-export]").forEach(function (link) {
      link.setAttribute("href", link.getAttribute("href").split("?")[0] + (query ? "?" + query : ""));
    });
  }
  document.addEventListener("htmx:pushedIntoHistory", refreshQueries);
  window.addEventListener("popstate", refreshQueries);
})();

// sasflow console: the one script (served from the console itself; the Content-Security-Policy allows no other).
// Without it every page works the same, only static: forms are checked again by the console, and nothing refreshes.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main) { return; }

  // A JSON editor (<textarea data-json="object|any">) says at once where its text is not JSON, and the form cannot
  // be sent until it is (an empty one is allowed: nothing is sent for it).
  function checkJson(area) {
    var problem = document.getElementById(area.id + "-problem");
    var text = area.value.trim();
    var why = "";
    if (text) {
      try {
        var value = JSON.parse(text);
        if (area.dataset.json === "object" && (value === null || typeof value !== "object" || Array.isArray(value))) {
          why = "The input must be a JSON object ({...}).";
        }
      } catch (error) {
        why = "Not JSON: " + error.message;
      }
    }
    area.setCustomValidity(why);
    area.setAttribute("aria-invalid", why ? "true" : "false");
    if (problem) { problem.textContent = why; problem.hidden = !why; }
  }
  Array.prototype.forEach.call(document.querySelectorAll("textarea[data-json]"), function (area) {
    area.addEventListener("input", function () { checkJson(area); });
  });

  // A form being filled in is kept in this tab's sessionStorage as it is typed, and given back if the page is
  // loaded again before it is sent (a reload, a crash of the tab, the back button).
  Array.prototype.forEach.call(document.querySelectorAll("form[data-draft]"), function (form) {
    var key = "sasflow-draft " + form.dataset.draft;
    var fields = form.querySelectorAll("textarea, input:not([type=hidden])");
    var saved = null;
    try { saved = JSON.parse(window.sessionStorage.getItem(key) || "null"); } catch (error) { saved = null; }
    if (saved && !document.querySelector("section.refusal")) {
      Array.prototype.forEach.call(fields, function (field) {
        if (typeof saved[field.name] === "string") { field.value = saved[field.name]; }
      });
    }
    Array.prototype.forEach.call(fields, function (field) {
      if (field.dataset.json !== undefined) { checkJson(field); }
      field.addEventListener("input", function () {
        var draft = {};
        Array.prototype.forEach.call(fields, function (f) { draft[f.name] = f.value; });
        try { window.sessionStorage.setItem(key, JSON.stringify(draft)); } catch (error) { /* full: not kept */ }
      });
    });
    form.addEventListener("submit", function () { window.sessionStorage.removeItem(key); });
  });

  // A confirmation is sent once from this page (a double click sends nothing more; the console and the API would
  // act once anyway, by the form's Idempotency-Key).
  Array.prototype.forEach.call(document.querySelectorAll("form[data-once]"), function (form) {
    form.addEventListener("submit", function (event) {
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
    });
  });

  // A page whose workflow still runs (<main data-refresh="N">) fetches itself every N seconds and replaces its main
  // content, keeping which <details> were open and the scroll position; it stops while the tab is hidden and once the
  // workflow has ended (the new page has no data-refresh). It waits while a field of the page has the focus.
  if (!main.dataset.refresh) { return; }
  var seconds = Math.max(1, parseInt(main.dataset.refresh, 10) || 3);
  function openDetails() {
    return Array.prototype.map.call(main.querySelectorAll("details[open]"), function (d) {
      var section = d.closest("section");
      return section ? section.id : "";
    });
  }
  function busy() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
  }
  function refresh() {
    if (document.hidden || busy()) { schedule(); return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (text) {
        if (text === null || busy()) { schedule(); return; }
        var page = new DOMParser().parseFromString(text, "text/html");
        var fresh = page.getElementById("main");
        if (!fresh) { return; }
        var open = openDetails();
        var x = window.scrollX, y = window.scrollY;
        main.innerHTML = fresh.innerHTML;
        open.forEach(function (id) {
          var section = id && document.getElementById(id);
          var details = section && section.querySelector("details");
          if (details) { details.open = true; }
        });
        window.scrollTo(x, y);
        if (fresh.dataset.refresh) { schedule(); } else { delete main.dataset.refresh; }
      })
      .catch(function () { schedule(); });
  }
  function schedule() { window.setTimeout(refresh, seconds * 1000); }
  schedule();
})();

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
        var finite = true;
        var value = JSON.parse(text, function (key, v) {
          if (typeof v === "number" && !isFinite(v)) { finite = false; }
          return v;
        });
        if (area.dataset.json === "object" && (value === null || typeof value !== "object" || Array.isArray(value))) {
          why = "The input must be a JSON object ({...}).";
        } else if (!finite) {
          why = "It holds a number JSON cannot carry (too large: it would be Infinity).";
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

  // A form being filled in is kept in this tab's sessionStorage as it is typed, and given back, with a note that
  // says so and a way to discard it, if the form is opened again before its action is done (a reload, a crashed
  // tab, the back button from the preview). The page that says an action was done drops its draft.
  Array.prototype.forEach.call(document.querySelectorAll("[data-clear-draft]"), function (done) {
    window.sessionStorage.removeItem("sasflow-draft " + done.dataset.clearDraft);
  });
  Array.prototype.forEach.call(document.querySelectorAll("form[data-draft]"), function (form) {
    var key = "sasflow-draft " + form.dataset.draft;
    var fields = form.querySelectorAll("textarea, input:not([type=hidden])");
    var saved = null;
    try { saved = JSON.parse(window.sessionStorage.getItem(key) || "null"); } catch (error) { saved = null; }
    var differs = saved && Array.prototype.some.call(fields, function (field) {
      return typeof saved[field.name] === "string" && saved[field.name] !== field.value;
    });
    if (differs && !document.querySelector("section.refusal")) {
      var original = {};
      Array.prototype.forEach.call(fields, function (field) {
        original[field.name] = field.value;
        if (typeof saved[field.name] === "string") { field.value = saved[field.name]; }
      });
      var note = document.createElement("p");
      note.className = "problem restored";
      note.setAttribute("role", "status");
      note.textContent = "Restored what you typed earlier in this tab (not sent). ";
      var discard = document.createElement("button");
      discard.type = "button";
      discard.textContent = "Discard it";
      discard.addEventListener("click", function () {
        window.sessionStorage.removeItem(key);
        Array.prototype.forEach.call(fields, function (field) { field.value = original[field.name]; });
        Array.prototype.forEach.call(fields, function (field) { if (field.dataset.json !== undefined) { checkJson(field); } });
        note.remove();
      });
      note.appendChild(discard);
      form.parentNode.insertBefore(note, form);
    }
    function keep() {
      var draft = {};
      Array.prototype.forEach.call(fields, function (f) { draft[f.name] = f.value; });
      try { window.sessionStorage.setItem(key, JSON.stringify(draft)); } catch (error) { /* full: not kept */ }
    }
    Array.prototype.forEach.call(fields, function (field) {
      if (field.dataset.json !== undefined) { checkJson(field); }
      field.addEventListener("input", keep);
    });
    // Text typed before this script ran fired no input event it heard: the page being left keeps it as well.
    window.addEventListener("pagehide", function () {
      var typed = Array.prototype.some.call(fields, function (f) { return f.value !== f.defaultValue; });
      if (typed) { keep(); }
    });
  });

  // A confirmation is sent once from this page, and says it is being sent (a double click sends nothing more; the
  // console and the API would act once anyway, by the form's Idempotency-Key).
  Array.prototype.forEach.call(document.querySelectorAll("form[data-once]"), function (form) {
    form.addEventListener("submit", function (event) {
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
      form.setAttribute("aria-busy", "true");
      var button = event.submitter;
      if (button && button.classList.contains("confirm")) { button.textContent = "Sending…"; }
    });
  });

  // A page whose workflow still runs (<main data-refresh="N">) fetches itself every N seconds and replaces its main
  // content, keeping which <details> were open and the scroll position; it stops while the tab is hidden and once the
  // workflow has ended (the new page has no data-refresh). It waits while a field of the page has the focus or text
  // of it is selected, and gives the focus back to the same link or button (keyboard use goes on where it was).
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
    var selection = window.getSelection ? String(window.getSelection()) : "";
    var typing = active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
    return Boolean(selection) || Boolean(typing);
  }
  function focused() {
    var active = document.activeElement;
    if (!active || active === main || !main.contains(active)) { return null; }
    var same = main.querySelectorAll(active.tagName);
    return { id: active.id, tag: active.tagName, href: active.getAttribute("href"),
             index: Array.prototype.indexOf.call(same, active) };
  }
  function refocus(was) {
    if (!was) { return; }
    var target = was.id ? document.getElementById(was.id) : null;
    if (!target && was.href) {
      target = Array.prototype.find.call(main.querySelectorAll(was.tag), function (e) {
        return e.getAttribute("href") === was.href;
      });
    }
    if (!target) { target = main.querySelectorAll(was.tag)[was.index]; }
    if (target) { target.focus({ preventScroll: true }); }
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
        var was = focused();
        var x = window.scrollX, y = window.scrollY;
        main.innerHTML = fresh.innerHTML;
        open.forEach(function (id) {
          var section = id && document.getElementById(id);
          var details = section && section.querySelector("details");
          if (details) { details.open = true; }
        });
        window.scrollTo(x, y);
        refocus(was);
        if (fresh.dataset.refresh) { schedule(); } else { delete main.dataset.refresh; }
      })
      .catch(function () { schedule(); });
  }
  function schedule() { window.setTimeout(refresh, seconds * 1000); }
  schedule();
})();

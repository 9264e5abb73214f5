// sasflow console: the one script (served from the console itself; the Content-Security-Policy allows no other).
// A page whose workflow still runs (<main data-refresh="N">) fetches itself every N seconds and replaces its main
// content, keeping which <details> were open and the scroll position; it stops while the tab is hidden and once the
// workflow has ended (the new page has no data-refresh). Without this script the page is the same, only static.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !main.dataset.refresh) { return; }
  var seconds = Math.max(1, parseInt(main.dataset.refresh, 10) || 3);
  function openDetails() {
    return Array.prototype.map.call(main.querySelectorAll("details[open]"), function (d) {
      var section = d.closest("section");
      return section ? section.id : "";
    });
  }
  function refresh() {
    if (document.hidden) { schedule(); return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (text) {
        if (text === null) { schedule(); return; }
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

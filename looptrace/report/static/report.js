// looptrace report: one run at a time. The address names what is shown (#run-..., or a turn inside a run); the
// overview otherwise. Without this script the page still works: a run's section shows when its link is followed.
(function () {
  "use strict";

  function show() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    var target = id ? document.getElementById(id) : null;
    var run = target ? target.closest("section.run") : null;
    document.querySelectorAll("section.run.current").forEach(function (section) {
      section.classList.remove("current");
    });
    document.body.classList.toggle("viewing-run", run !== null);
    if (run === null) {
      return;
    }
    run.classList.add("current");
    if (target === run) {
      window.scrollTo(0, 0);
    } else {
      target.scrollIntoView({ block: "center" });
    }
  }

  function filterRuns(event) {
    var words = event.target.value.toLowerCase().split(/\s+/).filter(Boolean);
    document.querySelectorAll("#runs tbody tr").forEach(function (row) {
      var text = row.textContent.toLowerCase() + " " + row.getAttribute("data-trace-id");
      row.hidden = !words.every(function (word) { return text.indexOf(word) !== -1; });
    });
  }

  function showAll(event) {
    var table = document.getElementById(event.target.getAttribute("data-table"));
    table.querySelectorAll("tr.more").forEach(function (row) { row.hidden = false; });
    event.target.remove();
  }

  window.addEventListener("hashchange", show);
  var filter = document.getElementById("run-filter");
  if (filter !== null) {
    filter.addEventListener("input", filterRuns);
  }
  document.querySelectorAll("button.show-more").forEach(function (button) {
    button.addEventListener("click", showAll);
  });
  show();
}());

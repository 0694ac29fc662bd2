// Draws every figure of the page: each <div class="chart"> names the JSON script element holding it. The
// figure's title is the heading above the div (the page writes it), so plotly draws none of its own.
(function () {
  "use strict";
  var config = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"]};
  // A legend of many entries wraps into more rows on a narrow screen than the figure's height holds:
  // the chart grows by what its legend runs past the bottom, so no entry is cut off.
  function fitLegend(el) {
    var legend = el.querySelector(".legend");
    if (!legend) return;
    var over = legend.getBoundingClientRect().bottom - el.getBoundingClientRect().bottom;
    if (over > 1) Plotly.relayout(el, {height: el._fullLayout.height + Math.ceil(over) + 8});
  }
  document.querySelectorAll("div.chart[data-figure]").forEach(function (el) {
    var source = document.getElementById(el.dataset.figure);
    var figure = JSON.parse(source.textContent);
    var layout = Object.assign({}, figure.layout, {title: {text: ""}});
    Plotly.newPlot(el, figure.data, layout, config).then(function () {
      fitLegend(el);
      el.on("plotly_afterplot", function () { fitLegend(el); });
    });
  });
})();

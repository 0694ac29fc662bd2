// Draws every figure of the page: each <div class="chart"> names the JSON script element holding it.
(function () {
  "use strict";
  var config = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"]};
  document.querySelectorAll("div.chart[data-figure]").forEach(function (el) {
    var source = document.getElementById(el.dataset.figure);
    var figure = JSON.parse(source.textContent);
    Plotly.newPlot(el, figure.data, figure.layout, config);
  });
})();

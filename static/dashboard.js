/* The dashboard's charts (templates/gateway/ledger_dashboard.html), drawn with the vendored
 * uPlot from the tables printed beside them: each table is its chart's accessible alternative
 * and its only data, so the picture and the numbers cannot disagree. No inline script or style
 * (the Content-Security-Policy forbids both): data comes from data attributes, colours from
 * the CSS custom properties of static/dashboard.css, so a change of theme (the system's or the
 * console's own) redraws every chart in the new colours. */
(function () {
  "use strict";

  var SERIES = 6;

  function colours(element) {
    var style = getComputedStyle(element);
    var read = function (name) { return style.getPropertyValue(name).trim(); };
    var series = [];
    for (var i = 0; i < SERIES; i++) series.push(read("--chart-" + i));
    return { series: series, axis: read("--chart-axis"), grid: read("--chart-grid") };
  }

  function number(text) {
    return text === "" ? null : Number(text);
  }

  // The table's numbers: x values (data-x of each row header), row labels, and one array per
  // column (data-value of each cell; "" is no value).
  function readTable(table) {
    var rows = table.tBodies[0].rows;
    var columns = Array.prototype.map.call(table.tHead.rows[0].cells, function (cell) {
      return cell.textContent.trim();
    }).slice(1);
    var xs = [], labels = [], shorts = [], values = columns.map(function () { return []; });
    for (var r = 0; r < rows.length; r++) {
      var header = rows[r].cells[0];
      xs.push(Number(header.getAttribute("data-x")));
      labels.push(header.textContent.trim());
      shorts.push(header.getAttribute("data-short") || header.textContent.trim());
      for (var c = 0; c < columns.length; c++) {
        values[c].push(number(rows[r].cells[c + 1].getAttribute("data-value")));
      }
    }
    return { xs: xs, labels: labels, shorts: shorts, columns: columns, values: values };
  }

  function axis(palette, unit, extra) {
    var spec = {
      stroke: palette.axis,
      grid: { stroke: palette.grid, width: 1 },
      ticks: { stroke: palette.grid, width: 1 },
    };
    if (unit) {
      spec.size = 64;
      spec.values = function (u, splits) {
        return splits.map(function (v) { return v == null ? "" : amount(v, unit); });
      };
    }
    for (var key in extra) spec[key] = extra[key];
    return spec;
  }

  // Seconds in the unit a person reads them in; other units as they are.
  function amount(value, unit) {
    if (unit !== "s") return value + " " + unit;
    if (value < 60) return value + " s";
    if (value < 3600) return Math.round(value / 60) + " min";
    return Math.round(value / 3600) + " h";
  }

  // Time ticks in UTC, as the tables print them: the hour, and the day when the range is
  // longer than one.
  function timeTicks(xs) {
    var long = xs.length > 1 && xs[xs.length - 1] - xs[0] > 86400;
    return function (u, splits) {
      return splits.map(function (v) {
        var iso = new Date(v * 1000).toISOString();
        return long ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, 16);
      });
    };
  }

  function options(plot, data, palette) {
    var kind = plot.getAttribute("data-chart");
    var unit = plot.getAttribute("data-unit") || "";
    var width = Math.max(plot.clientWidth, 240);
    var utc = function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); };
    var opts = {
      width: width,
      height: Math.round(Math.min(280, Math.max(180, width * 0.35))),
      legend: { show: false },
      cursor: { show: false },
      series: [{}],
      scales: { x: { time: kind !== "bars" } },
      axes: [axis(palette, "", { values: timeTicks(data.xs) }), axis(palette, unit)],
      tzDate: utc,
    };
    var columns = data.columns.map(function (_, i) { return i; });
    if (kind === "confirm") {
      // The count is in the table; the chart draws the two percentiles, on a log scale.
      columns = [1, 2];
      opts.scales.y = { distr: 3 };
    }
    if (kind === "bars") {
      // The short labels where the full ones would not fit side by side.
      var labels = width / data.labels.length < 110 ? data.shorts : data.labels;
      opts.scales.x = { time: false, range: [-0.5, labels.length - 0.5] };
      opts.axes[0] = axis(palette, "", {
        splits: function () { return labels.map(function (_, i) { return i; }); },
        values: function (u, splits) { return splits.map(function (i) { return labels[i]; }); },
      });
    }
    columns.forEach(function (column, n) {
      var colour = palette.series[column % SERIES];
      var serie = { label: data.columns[column], stroke: colour, width: 2, spanGaps: false };
      if (kind === "bars") {
        serie.fill = colour;
        serie.paths = uPlot.paths.bars({ size: [0.35, 60], align: n === 0 ? -1 : 1 });
        serie.points = { show: false };
      }
      opts.series.push(serie);
    });
    var xs = kind === "bars" ? data.labels.map(function (_, i) { return i; }) : data.xs;
    var series = [xs].concat(columns.map(function (column) { return data.values[column]; }));
    return { opts: opts, series: series };
  }

  function sparkOptions(element, palette) {
    var points = element.getAttribute("data-spark").split(" ").map(Number);
    return {
      opts: {
        width: 120,
        height: 28,
        legend: { show: false },
        cursor: { show: false },
        scales: { x: { time: false } },
        axes: [{ show: false }, { show: false }],
        series: [{}, { stroke: palette.series[0], fill: palette.grid, width: 1.5, points: { show: false } }],
      },
      series: [points.map(function (_, i) { return i; }), points],
    };
  }

  var drawn = [];

  function drawAll() {
    if (typeof uPlot === "undefined") return;
    drawn.forEach(function (chart) { chart.destroy(); });
    drawn = [];
    document.querySelectorAll("[data-chart]").forEach(function (plot) {
      var table = document.getElementById(plot.getAttribute("data-table"));
      if (!table) return;
      var spec = options(plot, readTable(table), colours(plot));
      drawn.push(new uPlot(spec.opts, spec.series, plot));
    });
    document.querySelectorAll("[data-spark]").forEach(function (element) {
      var spec = sparkOptions(element, colours(element));
      drawn.push(new uPlot(spec.opts, spec.series, element));
    });
  }

  function init() {
    drawAll();
    // A theme change: the system's, or the console's own toggle (an attribute of <html>).
    var scheme = window.matchMedia("(prefers-color-scheme: light)");
    if (scheme.addEventListener) scheme.addEventListener("change", drawAll);
    new MutationObserver(drawAll).observe(document.documentElement, { attributes: true });
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(drawAll, 150);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();

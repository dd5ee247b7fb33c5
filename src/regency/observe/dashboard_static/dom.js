// DOM helpers of the regency dashboard, shared by its scripts: every element is made from
// text (textContent, createElement), never from HTML, so strings from the mesh stay text.
"use strict";

const dom = (function () {
  const SVG_NS = "http://www.w3.org/2000/svg";

  function byId(id) {
    return document.getElementById(id);
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children.flat()) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) {
        node.setAttribute(name, String(value));
      }
    }
  }

  function fixed(value) {
    if (value === null || value === undefined) return "–";
    return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
  }


  return { byId: byId, el: el, svg: svg, fixed: fixed };
})();

"""The browser demo page's files (``trio-duplex serve --demo``; served by server/front/demo.py).

Not Python: HTML, CSS and JavaScript modules, shipped as package data. The JavaScript
client ``trio-duplex.js`` is a link to ``clients/js/src/trio-duplex.js``, copied into
wheels when they are built (docs/browser.md, "The demo page").
"""

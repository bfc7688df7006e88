"""`charlm explore`'s full-screen app (Textual; imported by that command only): the app itself (app.py), its two
views, a Transformer's heads and an LSTM/GRU's units (views.py), the widgets they are drawn with (widgets.py)
and its `?` pages (help.py). Every number it shows is computed below it, in charlm/commands/explore.py. Nothing
is re-exported here: import the module you need (charlm.explore.app, ...)."""

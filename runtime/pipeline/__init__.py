"""The request pipeline: small stages chained in the order the PoP config gives.

`stage` holds the interface and the per-request context, `chain` links stages
into the app the HTTP front serves, `contain` turns failures into responses,
`build` makes stages from config, and `stages/` holds one module per stage.
"""

"""`python -m modelmux ARGS`: the server binary with the same arguments, its Python workers
run on this interpreter (see `modelmux._cli`)."""

from modelmux._cli import main

main()

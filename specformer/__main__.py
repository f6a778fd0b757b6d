from specformer.cli import main

main()

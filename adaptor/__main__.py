from adaptor.cli import main

main()

from adaptord.cli import main

main()

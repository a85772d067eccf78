from adaptord._entry import main

main()

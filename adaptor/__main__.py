from adaptor._entry import main

main()

from batchinfer.entry import main

main()

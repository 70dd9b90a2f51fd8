from drivers.docker.main import main

main()

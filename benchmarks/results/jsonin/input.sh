for dt in FP32 INT32; do
 A=1000 B=5000 ./run.sh $1 $2 --json --values 16 --datatype $dt
 A=300 B=1500 ./run.sh $1 $2 --json --values 256 --datatype $dt
 A=30 B=150 ./run.sh $1 $2 --json --values 4096 --datatype $dt
done

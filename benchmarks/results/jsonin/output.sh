for dt in FP32 INT32; do for n in 256 4096; do
 A=1000 B=5000 ./run.sh $1 $2 --values $n --datatype $dt
 A=1000 B=5000 ./run.sh $1 $2 --values $n --datatype $dt --json-output
done; done
